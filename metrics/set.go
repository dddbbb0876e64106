package metrics

import (
	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Set is every stepcollect metric, registered on one registry. Both
// binaries register the whole set (the contract has each expose all of
// them); each metric moves only in the binary where its work happens.
type Set struct {
	Registry *prometheus.Registry
	Storage  *Storage
	Sweeper  *Sweeper
	Enqueue  *Enqueue
	API      *API
	Delivery *Delivery
}

// New registers the Go and process collectors, every stepcollect metric,
// and, through inspector, asynq's view of queues.
func New(inspector *asynq.Inspector, taskTypes []string, queues ...string) *Set {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s := &Set{
		Registry: reg,
		Storage:  NewStorage(reg),
		Sweeper:  NewSweeper(reg),
		Enqueue:  NewEnqueue(reg, taskTypes...),
		API:      NewAPI(reg),
		Delivery: NewDelivery(reg, "step.completed", "step.timed_out", "step.due"),
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
