package metrics

import (
	"database/sql"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/internal/version"
)

// Set is every stepcollect metric, registered on one registry. Both
// binaries register the whole set (docs/reference.md, "Metrics": each
// exposes all of them); each metric moves only in the binary where its work happens.
type Set struct {
	Registry *prometheus.Registry
	Storage  *Storage
	Sweeper  *Sweeper
	Enqueue  *Enqueue
	API      *API
	Delivery *Delivery
	RePush   *RePush
}

// New registers the Go and process collectors, every stepcollect metric,
// and, through inspector, the queue's view of queues (none when nil).
func New(inspector QueueReader, taskTypes []string, queues ...string) *Set {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(NewBuildInfo(version.Get()))
	s := &Set{
		Registry: reg,
		Storage:  NewStorage(reg),
		Sweeper:  NewSweeper(reg),
		Enqueue:  NewEnqueue(reg, taskTypes...),
		API:      NewAPI(reg),
		Delivery: NewDelivery(reg, events.StepCompleted, events.StepTimedOut, events.StepDue),
		RePush:   NewRePush(reg),
	}
	if inspector != nil {
		reg.MustRegister(NewQueueCollector(inspector, queues...))
	}
	return s
}

// Up exports stepcollect_<name>_up: 1 when probe succeeds at scrape time,
// else 0. Probed on every scrape, so any replica's value is current.
func (s *Set) Up(name string, probe func() error) {
	s.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace,
		Name:      name + "_up",
		Help:      "1 when this process reached " + name + " at the last scrape, 0 when it did not.",
	}, func() float64 {
		if probe() != nil {
			return 0
		}
		return 1
	}))
}

// NewBuildInfo is stepcollect_build_info{version,commit,go_version}, always
// 1: which build each replica runs (a rolling upgrade shows as two series),
// the same values as the binary's -version.
func NewBuildInfo(v version.Info) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: Namespace,
		Name:      "build_info",
		Help:      "Always 1; its labels say which build of stepcollect this process runs (as -version prints it).",
	}, []string{"version", "commit", "go_version"})
	g.WithLabelValues(v.Version, v.Commit, v.GoVersion).Set(1)
	return g
}

// DBPoolName is the db_name label of the go_sql_* metrics RegisterDB exports.
const DBPoolName = "stepcollect"

// RegisterDB exports db's pool statistics (database/sql's DBStats, read at
// scrape time) as client_golang's go_sql_* metrics with db_name
// "stepcollect": open, in use and idle connections against
// -mysql-max-conns, and how often and how long callers waited for one.
// Call it once per Set, with the pool the storage uses.
func (s *Set) RegisterDB(db *sql.DB) {
	s.Registry.MustRegister(collectors.NewDBStatsCollector(db, DBPoolName))
}
