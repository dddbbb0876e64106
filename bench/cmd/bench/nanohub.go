package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/stepcollect/stepcollect/bench/internal/fanout"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/mdmsim"
	"github.com/stepcollect/stepcollect/internal/testkit/nanomdm"
)

// The NanoHUB section: NanoHUB v0.2.0's own binary and stepcollect's
// cmd/nanohub, each with -storage mysql on a fresh database of the
// -mysql-dsn server, N simulated Macs enrolled at its own /mdm, one
// workflow start for all N through NanoCMD's API under NanoHUB's prefix,
// the Macs woken (no APNs push can be sent) and answering its one
// DeviceInformation at about the same moment: what issue 62 lost to error
// 1205.

const (
	nanoHubTheirs = "nanohub"             // NanoHUB v0.2.0, built from its own go.mod by bench-build
	nanoHubOurs   = "stepcollect-nanohub" // cmd/nanohub
	// devinfolog, not the inventory: NanoHUB v0.2.0 registers the
	// inventory workflow only with storage other than mysql
	nanoHubWorkflow   = "io.micromdm.wf.devinfolog.v1"
	nanoHubAPIKey     = "bench-nanohub-api-key"
	nanoHubCertHeader = "X-Client-Cert"
	nanoHubKMFDDM     = "kmfddm-schema.sql" // in -bin, copied by bench-build
	// no new answer or completion for this long: the rest are not coming
	nanoHubStall = time.Minute
	nanoHubLimit = 5 * time.Minute
)

// nanoHubServer is a row's binary.
type nanoHubServer struct {
	Label  string
	Binary string // in -bin
	// Schema: NanoHUB v0.2.0 leaves its storages' tables to the operator,
	// who loads NanoMDM's, NanoCMD's and KMFDDM's schema.sql; stepcollect's
	// makes them at start on an empty database.
	Schema bool
}

var nanoHubServers = []nanoHubServer{
	{Label: "NanoHUB v0.2.0", Binary: nanoHubTheirs, Schema: true},
	{Label: "stepcollect `nanohub`", Binary: nanoHubOurs},
}

// nanoHubSetting is the session settings of a server's connections, as
// DSN parameters (go-sql-driver sets unknown ones as session variables).
type nanoHubSetting struct {
	Name   string
	params map[string]string
}

var nanoHubSettings = []nanoHubSetting{
	{Name: "defaults"},
	{Name: "READ COMMITTED, lock wait 2 s", params: map[string]string{
		"transaction_isolation": "%27READ-COMMITTED%27", "innodb_lock_wait_timeout": "2"}},
}

// nanoHubResult is the section.
type nanoHubResult struct {
	Mode  string        `json:"mode"` // "nanohub"
	N     int           `json:"n"`
	MySQL string        `json:"mysql"`
	Runs  []*nanoHubRun `json:"runs"`
}

// nanoHubRun is one server at one setting.
type nanoHubRun struct {
	Server    string `json:"server"`
	Setting   string `json:"setting"`
	Start     string `json:"start"` // the start's answer
	Enrolled  int    `json:"enrolled"`
	StepIDs   int    `json:"step_ids"`  // enrollments in the engine's step after the start
	Answered  int    `json:"answered"`  // DeviceInformation results NanoMDM stored, Acknowledged
	Completed int    `json:"completed"` // enrollments whose step rows are gone
	// From the start: to every enrollment completed (0: not all), and to
	// the last answer or completion seen.
	DoneMS     float64            `json:"done_ms"`
	ProgressMS float64            `json:"last_progress_ms"`
	CPU        map[string]float64 `json:"cpu_ms"` // "nanohub", "mysqld", to the last progress
	LockWaits  int                `json:"log_1205"`
	Deadlocks  int                `json:"log_1213"`
	Sessions   string             `json:"sessions"` // the server's connections' settings, seen after the start
	Fleet      string             `json:"fleet"`
	FleetErrs  []string           `json:"fleet_errors,omitempty"`
}

// lost are the devices that answered but whose step never completed.
func (run *nanoHubRun) lost() int { return max(0, run.Answered-run.Completed) }

// perResult is process name's CPU per answer NanoMDM stored, in ms.
func (run *nanoHubRun) perResult(name string) string {
	cpu, ok := run.CPU[name]
	if !ok || run.Answered == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", cpu/float64(run.Answered))
}

// nanoHub runs the section: each server at each setting, on MySQL.
func (r *runner) nanoHub(n int) (*nanoHubResult, error) {
	res := &nanoHubResult{Mode: "nanohub", N: n, MySQL: r.mysqlSrv.version}
	for _, set := range nanoHubSettings {
		for _, srv := range nanoHubServers {
			run, err := r.nanoHubRun(srv, set, n)
			if err != nil {
				return nil, fmt.Errorf("%s, %s: %w", srv.Label, set.Name, err)
			}
			res.Runs = append(res.Runs, run)
		}
	}
	return res, nil
}

// nanoHubRun runs srv on a fresh database at set with n devices, and
// measures from the start to every enrollment's step completed, or to the
// last progress before nanoHubStall without any.
func (r *runner) nanoHubRun(srv nanoHubServer, set nanoHubSetting, n int) (*nanoHubRun, error) {
	r.step++
	progress("[%d/%d] %-22s %-30s N=%-5d one devinfolog start …", r.step, max(r.total, r.step), srv.Label, set.Name, n)
	run := &nanoHubRun{Server: srv.Label, Setting: set.Name}
	dir, err := os.MkdirTemp("", "bench-nanohub-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	dsn, drop, err := r.nanoHubDatabase(srv, set)
	if err != nil {
		return nil, err
	}
	defer drop()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, err
	}
	defer db.Close()

	ca, caPath, err := nanoHubCA(dir)
	if err != nil {
		return nil, err
	}
	port, err := testkit.PickPort()
	if err != nil {
		return nil, err
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	hub, err := startProc(filepath.Join(r.bin, srv.Binary), nil, "-listen", fmt.Sprintf("127.0.0.1:%d", port),
		"-storage", "mysql", "-storage-dsn", dsn, "-ca", caPath, "-cert-header", nanoHubCertHeader, "-api-key", nanoHubAPIKey)
	if err != nil {
		return nil, fmt.Errorf("%w (make bench-build builds %s)", err, srv.Binary)
	}
	defer hub.stop()
	if err := awaitOK(base+"/version", 60*time.Second); err != nil {
		return nil, fmt.Errorf("%v\n%s", err, hub.logs.String())
	}
	fleet, err := mdmsim.NewFleet(ca, mdmsim.Target{MDMURL: base + "/mdm", CertHeader: nanoHubCertHeader},
		mdmsim.FleetConfig{N: n, UDIDPrefix: realStackUDIDPrefix, PollEvery: time.Hour})
	if err != nil {
		return nil, err
	}
	enrollCtx, enrolled := context.WithTimeout(context.Background(), 5*time.Minute)
	err = fleet.Enroll(enrollCtx)
	enrolled()
	if err != nil {
		return nil, fmt.Errorf("enrolling: %w\n%s", err, hub.logs.String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { fleet.Run(ctx); close(ran) }()
	defer func() { cancel(); <-ran }()
	if run.Enrolled, err = queryInt(db, "SELECT COUNT(*) FROM enrollments WHERE enabled"); err != nil {
		return nil, err
	}
	client := warmedClient(base+"/version", 4)
	pids := map[string]int{"nanohub": hub.cmd.Process.Pid}
	if pid := mysqldPID(r.mysqlSrv.dsn); pid > 0 {
		pids["mysqld"] = pid
	}

	r.settle()
	cpu0 := cpuTimes(pids)
	t0 := time.Now()
	if run.Start, err = nanoHubStart(client, base, fleet.IDs()); err != nil {
		return nil, fmt.Errorf("%v\n%s", err, hub.logs.String())
	}
	fleet.Wake()
	if run.StepIDs, err = queryInt(db, "SELECT COUNT(DISTINCT enrollment_id) FROM id_commands"); err != nil {
		return nil, err
	}
	if run.Sessions, err = nanoHubSessions(db); err != nil {
		return nil, err
	}
	last := nanoHubAwait(run, db, pids, t0)
	run.CPU = map[string]float64{}
	for name := range pids {
		run.CPU[name] = last.cpu[name] - cpu0[name]
	}
	logs := hub.logs.String()
	run.LockWaits = strings.Count(logs, "Error 1205")
	run.Deadlocks = strings.Count(logs, "Error 1213")
	run.Fleet = fleet.Progress().String()
	for _, err := range fleet.Errors() {
		run.FleetErrs = append(run.FleetErrs, err.Error())
	}
	nanoHubDone(run, n)
	return run, nil
}

// nanoHubDatabase is a fresh database on the -mysql-dsn server with set's
// session parameters: empty for stepcollect's server, with the schemas
// NanoHUB v0.2.0's operator loads for its own.
func (r *runner) nanoHubDatabase(srv nanoHubServer, set nanoHubSetting) (string, func(), error) {
	admin, server := r.mysqlSrv.admin, r.mysqlSrv.dsn
	if !srv.Schema {
		return newDatabase(admin, server, "bench_nanohub_", set.params, false, func(*sql.DB) error { return nil })
	}
	var schemas []string
	for _, f := range []string{e2eSchema, nanoHubKMFDDM} { // NanoCMD's engine and profiles, KMFDDM's
		b, err := os.ReadFile(filepath.Join(r.bin, f))
		if err != nil {
			return "", nil, fmt.Errorf("%v (make bench-build copies it)", err)
		}
		schemas = append(schemas, string(b))
	}
	return newDatabase(admin, server, "bench_nanohub_v020_", set.params, true, func(db *sql.DB) error {
		if err := nanomdm.LoadSchema(context.Background(), db); err != nil {
			return err
		}
		for _, s := range schemas {
			if _, err := db.Exec(s); err != nil {
				return fmt.Errorf("loading NanoHUB v0.2.0's schemas: %w", err)
			}
		}
		return nil
	})
}

// nanoHubCA is a CA for the devices' identities, and the path of its PEM
// in dir, for the server's -ca.
func nanoHubCA(dir string) (*nanomdm.CA, string, error) {
	ca, err := nanomdm.NewCA()
	if err != nil {
		return nil, "", err
	}
	path := filepath.Join(dir, "ca.pem")
	return ca, path, os.WriteFile(path, ca.PEM(), 0o600)
}

// nanoHubStart starts the workflow for ids in one request through
// NanoCMD's API under NanoHUB's prefix and describes the answer. NanoHUB
// v0.2.0 answers 500 when the APNs push fails (there is no push
// certificate here) after storing the step and queueing its command.
func nanoHubStart(client *http.Client, base string, ids []string) (string, error) {
	q := url.Values{"id": ids}
	req, _ := http.NewRequest(http.MethodPost, base+"/api/v1/nanocmd/workflow/"+nanoHubWorkflow+"/start?"+q.Encode(), nil)
	req.SetBasicAuth("nanohub", nanoHubAPIKey)
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("starting the workflow: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("%s `%s`", resp.Status, strings.TrimSpace(string(body))), nil
	}
	return resp.Status, nil
}

// nanoHubSample is what the run's database and processes showed at one
// look.
type nanoHubSample struct {
	at                  time.Time
	answered, remaining int
	cpu                 map[string]float64
}

// nanoHubAwait looks, every 100 ms, at the answers NanoMDM stored and the
// enrollments left in the engine's step, until none is left, nanoHubStall
// passes without either changing, or nanoHubLimit; fills run and returns
// the last look at which either changed.
func nanoHubAwait(run *nanoHubRun, db *sql.DB, pids map[string]int, t0 time.Time) nanoHubSample {
	last := nanoHubSample{at: t0, answered: -1, remaining: -1, cpu: cpuTimes(pids)}
	for {
		s, err := nanoHubLook(db)
		if err == nil && (s.answered != last.answered || s.remaining != last.remaining) {
			s.cpu = cpuTimes(pids)
			last = s
		}
		if err == nil && s.remaining == 0 {
			run.DoneMS = fanout.MS(s.at.Sub(t0))
			break
		}
		if time.Since(last.at) > nanoHubStall || time.Since(t0) > nanoHubLimit {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	run.ProgressMS = fanout.MS(last.at.Sub(t0))
	run.Answered = max(0, last.answered)
	run.Completed = max(0, run.StepIDs-last.remaining)
	return last
}

// nanoHubLook counts the DeviceInformation results NanoMDM stored
// Acknowledged and the enrollments left in the engine's step.
func nanoHubLook(db *sql.DB) (nanoHubSample, error) {
	s := nanoHubSample{}
	err := db.QueryRow(`SELECT
		(SELECT COUNT(*) FROM command_results r JOIN commands c ON c.command_uuid = r.command_uuid
			WHERE c.request_type = 'DeviceInformation' AND r.status = 'Acknowledged'),
		(SELECT COUNT(DISTINCT enrollment_id) FROM id_commands)`).Scan(&s.answered, &s.remaining)
	s.at = time.Now()
	return s, err
}

// nanoHubSessions describes the isolation level and lock wait of the
// connections to the run's database other than this one: the server's.
func nanoHubSessions(db *sql.DB) (string, error) {
	rows, err := db.Query(`SELECT v.VARIABLE_NAME, v.VARIABLE_VALUE, COUNT(*)
		FROM performance_schema.variables_by_thread v JOIN performance_schema.threads t ON t.THREAD_ID = v.THREAD_ID
		WHERE t.PROCESSLIST_DB = DATABASE() AND t.PROCESSLIST_ID <> CONNECTION_ID()
			AND v.VARIABLE_NAME IN ('transaction_isolation', 'innodb_lock_wait_timeout')
		GROUP BY 1, 2 ORDER BY 1 DESC, 3 DESC`)
	if err != nil {
		return "", fmt.Errorf("reading the server's session settings: %w", err)
	}
	defer rows.Close()
	var parts []string
	for rows.Next() {
		var name, value string
		var k int
		if err := rows.Scan(&name, &value, &k); err != nil {
			return "", err
		}
		parts = append(parts, fmt.Sprintf("%s=%s × %d", name, value, k))
	}
	return strings.Join(parts, ", "), rows.Err()
}

// queryInt runs a query of one integer.
func queryInt(db *sql.DB, query string) (int, error) {
	var n int
	if err := db.QueryRow(query).Scan(&n); err != nil {
		return 0, fmt.Errorf("%s: %w", query, err)
	}
	return n, nil
}

func nanoHubDone(run *nanoHubRun, n int) {
	done := fmt.Sprintf("%d of %d completed, stopped at %s", run.Completed, n, dur(run.ProgressMS))
	if run.DoneMS > 0 {
		done = "every enrollment completed in " + dur(run.DoneMS)
	}
	fmt.Fprintf(os.Stderr, " %s; %d answered, %d lost, %d × 1205 and %d × 1213 in the log, %s ms server CPU a result\n",
		done, run.Answered, run.lost(), run.LockWaits, run.Deadlocks, run.perResult("nanohub"))
}

// markdown is the section's table and what each start answered.
func (s *nanoHubResult) markdown() string {
	if len(s.Runs) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## NanoHUB: one workflow start for N=%d devices at NanoHUB's own `/mdm`\n\n"+
		"NanoHUB v0.2.0's own binary (built from its own `go.mod`: NanoCMD v0.7.0's engine on its MySQL storage) and stepcollect's "+
		"`nanohub` (NanoCMD's engine on stepcollect's storage), each with `-storage mysql` on a fresh database of MySQL %s, "+
		"`-ca`, `-cert-header` and `-api-key` and every other flag at its default; NanoHUB v0.2.0's database has NanoMDM's, "+
		"NanoCMD's and KMFDDM's `schema.sql` loaded first, as its operator must, stepcollect's is empty. %d simulated Macs "+
		"(`internal/testkit/mdmsim`) enroll at the server's `/mdm`; one start of `%s` for all of them through "+
		"`POST /api/v1/nanocmd/workflow/…/start`; there is no APNs certificate, so each Mac is woken once the start is "+
		"answered, as a push would, and answers the step's one DeviceInformation then. (The inventory workflow is not "+
		"used: NanoHUB v0.2.0 registers it only with storage other than mysql.) **defaults** are MySQL's for the server's "+
		"connections (REPEATABLE READ, lock wait 50 s; stepcollect's storage sets READ COMMITTED on its own connections "+
		"whatever the setting); **READ COMMITTED, lock wait 2 s** is `transaction_isolation='READ-COMMITTED'` and "+
		"`innodb_lock_wait_timeout=2` as DSN parameters, so for every connection of the server. "+
		"**answered** are the DeviceInformation results NanoMDM stored Acknowledged; **completed** the enrollments whose "+
		"rows left the engine's step (`id_commands`); **lost** = answered − completed: NanoHUB answers the Mac before it "+
		"hands the result to its engine, so a result the engine fails to store is not sent again. **Time to all done** is "+
		"from the start to no enrollment left in the step; a run with some left stops after %s without a new answer or "+
		"completion (at most %s), and shows when it last moved. **CPU per result** is the process's user + system time "+
		"from the start to that moment over the answers.\n\n",
		s.N, s.MySQL, s.N, nanoHubWorkflow, nanoHubStall, nanoHubLimit)
	b.WriteString("| server | MySQL session | enrolled | answered | completed | lost | time to all done | server CPU per result (ms) | mysqld CPU per result (ms) | errors 1205 / 1213 in its log |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, run := range s.Runs {
		done := dur(run.DoneMS)
		if run.DoneMS == 0 {
			done = fmt.Sprintf("not done (stopped at %s)", dur(run.ProgressMS))
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | **%d** | %s | %s | %s | %d / %d |\n", run.Server, run.Setting, run.Enrolled,
			run.Answered, run.Completed, run.lost(), done, run.perResult("nanohub"), run.perResult("mysqld"), run.LockWaits, run.Deadlocks)
	}
	b.WriteString("\n")
	for _, run := range s.Runs {
		fmt.Fprintf(&b, "- %s, %s: the start answered %s; %d enrollments in the step after it; the server's connections: %s; devices: %s",
			run.Server, run.Setting, run.Start, run.StepIDs, run.Sessions, run.Fleet)
		if len(run.FleetErrs) > 0 {
			fmt.Fprintf(&b, "; device errors: %s", strings.Join(run.FleetErrs, "; "))
		}
		b.WriteString(".\n")
	}
	fmt.Fprintf(&b, "\nThis section alone: `make bench BENCH_FLAGS='-only nanohub -nanohub-n %d' BENCH_GALERA= BENCH_GROUP=`.\n\n", s.N)
	return b.String()
}
