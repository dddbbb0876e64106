package main

import (
	"fmt"
	"strings"
)

// The figures and the markdown of the end-to-end section.

// cpuMS is the CPU time, in ms, of the service's processes (service) and
// of the database server (db).
func (run *e2eRun) cpuMS(service, db bool) float64 {
	t := 0.0
	if service {
		for _, p := range run.Service {
			t += run.CPU[p]
		}
	}
	if db {
		t += run.CPU[run.dbProc()]
	}
	return t
}

// dbProc is the database server's process name in CPU.
func (run *e2eRun) dbProc() string {
	if run.DB == "" {
		return "mariadbd"
	}
	return run.DB
}

func (run *e2eRun) cpuPerWebhook(service, db bool) float64 {
	if run.Webhooks == 0 {
		return 0
	}
	return run.cpuMS(service, db) / float64(run.Webhooks)
}

// statementKinds are the rows of statements per result: a label and the
// status counters summed into it.
var statementKinds = []struct {
	label string
	vars  []string
}{
	{"SELECT", []string{"Com_select"}},
	{"INSERT", []string{"Com_insert", "Com_insert_select", "Com_replace", "Com_replace_select"}},
	{"UPDATE", []string{"Com_update", "Com_update_multi"}},
	{"DELETE", []string{"Com_delete", "Com_delete_multi"}},
	{"BEGIN", []string{"Com_begin"}},
	{"COMMIT", []string{"Com_commit"}},
	{"ROLLBACK", []string{"Com_rollback"}},
}

func (run *e2eRun) perResult(vars ...string) float64 {
	if run.Webhooks == 0 {
		return 0
	}
	t := 0.0
	for _, v := range vars {
		t += run.Statements[v]
	}
	return t / float64(run.Webhooks)
}

// otherStatements is Questions less the kinds above, per result: SET, a
// connection's COM_QUIT and the like.
func (run *e2eRun) otherStatements() float64 {
	o := run.perResult("Questions")
	for _, k := range statementKinds {
		o -= run.perResult(k.vars...)
	}
	return o
}

// markdown is the section.
func (e *e2eResult) markdown() string {
	if len(e.Runs) != 2 {
		return ""
	}
	nc, sc := e.Runs[0], e.Runs[1]
	var b strings.Builder
	fmt.Fprintf(&b, "## End to end against NanoCMD's own server\n\n"+
		"What a user running either gets, in one run on the same private mariadbd (the **%s** server setting): the same step, the "+
		"inventory workflow's two commands (DeviceInformation and SecurityInfo) to the same N=%d enrollments, then all %d results "+
		"through NanoMDM v0.9.0's own webhook sender (`webhook.New(url).CommandAndReportResults`), %d enrollments at a time, each "+
		"enrollment's two results one after the other as a device answers its queue (so at most %d webhook requests in flight, on "+
		"connections opened beforehand).\n\n", e.Server, e.N, 2*e.N, e.Inflight, e.Inflight)
	fmt.Fprintf(&b, "- **%s**: its own server, `cmd/nanocmd` built from the module (`go build github.com/micromdm/nanocmd/cmd/nanocmd` in the bench "+
		"module; its `plist` dependency is v0.2.2, as in the main module: the module proxy does not serve v0.4.0), every flag at its "+
		"default but `-storage mysql -storage-dsn … -api … -enqueue-url … -push-url … -enqueue-api …`, on a fresh database with NanoCMD's "+
		"own `engine/storage/mysql/schema.sql` (and the profile subsystem's). Its NanoMDM is a fake in the bench process that answers "+
		"`PUT /v1/enqueue/{ids}` and `GET /v1/push/{ids}` 200 and records which command UUIDs were enqueued to each enrollment. The step "+
		"is started with one %s.", nc.Impl, nc.Start)
	if nc.MDM != nil {
		fmt.Fprintf(&b, " The fake got %d enqueue requests (%d of them with an empty body: NanoCMD enqueues to 30 ids a request and "+
			"sends every chunk after a command's first from the same, already read, buffer; each is attributed to the command before it), "+
			"%d commands to %d enrollments, %d pushes.", nc.MDM.Enqueues, nc.MDM.EmptyBodies, nc.MDM.Commands, nc.MDM.Enrollments, nc.MDM.Pushes)
	}
	b.WriteString(" NanoCMD sets no limits on its `sql.DB`, so database/sql keeps at most 2 idle connections: with many requests in " +
		"flight most of its statements open a connection of their own and close it after (the connections row). " +
		"**Every enrollment done**: `id_commands` holds no row (NanoCMD deletes an enrollment's rows, and collects the " +
		"step, in the request of the result that completes it), looked at once the last webhook is answered and every 10 ms after " +
		"that while it still holds rows, and then every enrollment's values in its inventory route (`GET /inventory` with the N ids, " +
		"every 10 ms until they are all there): the later of the last answer and the look that found them all.\n")
	fmt.Fprintf(&b, "- **%s**: the real `cmd/api` and one `cmd/worker` at their defaults (log level info) but for the worker's sweeper, "+
		"off (`-sweep-interval 0`, as in the service rows; NanoCMD's own worker, every 300 s by default, does not run within the run "+
		"either), Redis a private `redis-server`; the step is stored with one %s. **Every enrollment done**: the arrival of the last "+
		"of the N distinct `step.completed` events at the receiver in the bench process.\n\n", sc.Impl, sc.Start)
	b.WriteString("**CPU** is each process's user + system time from `/proc/<pid>/stat`, over a window from the release of the first " +
		"webhook to every enrollment done and, for stepcollect, on to the outbox empty and the step collected (what the run caused, " +
		"looked at every 10 ms); **per webhook** divides the service's and mariadbd's by the webhooks sent. The service is " +
		"`nanocmd` for NanoCMD and `api` + `worker` + `redis-server` for stepcollect. **Statements per result** are the server's " +
		"`SHOW GLOBAL STATUS` deltas over the same window (`Com_*`, `Questions`, `Connections`; the bench's mariadbd is private, so " +
		"they are this run's alone), less the bench's own looks at the tables and the closing `SHOW`, divided by the webhooks sent. " +
		"A prepared statement's execution counts under its kind (NanoCMD's driver prepares every statement with arguments, " +
		"stepcollect interpolates them); the prepares are shown apart. What the server does in the background after the window " +
		"(purge, page flushing) is counted for neither. Webhook latencies are each request's own, from sending it to its answer. " +
		"**ratio** is stepcollect ÷ NanoCMD.\n\n")
	if e.Shared {
		b.WriteString("**This run used a shared server (`-server`)**: the statement counters and mariadbd's CPU include whatever else it ran, and mariadbd's CPU was not measured.\n\n")
	}

	ratio := func(a, b float64) string {
		if a == 0 || b == 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f×", b/a)
	}
	doneStr := func(r *e2eRun) string {
		if r.DoneMS == 0 {
			return fmt.Sprintf("not within the wait (%d of %d done)", r.Done, e.N)
		}
		return dur(r.DoneMS)
	}
	sec := func(ms float64) string { return fmt.Sprintf("%.2f s", ms/1000) }
	split := func(r *e2eRun) string {
		var parts []string
		for _, p := range r.Service {
			parts = append(parts, fmt.Sprintf("%s %.3f", p, r.CPU[p]/float64(max(r.Webhooks, 1))))
		}
		return strings.Join(parts, " + ")
	}
	procs := func(r *e2eRun) string {
		var parts []string
		for _, p := range r.Service {
			parts = append(parts, fmt.Sprintf("%s %s", p, sec(r.CPU[p])))
		}
		return strings.Join(parts, ", ")
	}
	fmt.Fprintf(&b, "| | %s | %s | ratio |\n|---|--:|--:|--:|\n", nc.Impl, sc.Impl)
	fmt.Fprintf(&b, "| **release to every enrollment done** | %s | %s | %s |\n", doneStr(nc), doneStr(sc), ratio(nc.DoneMS, sc.DoneMS))
	fmt.Fprintf(&b, "| release to the last webhook answered | %s | %s | %s |\n", dur(nc.LastAnswerMS), dur(sc.LastAnswerMS), ratio(nc.LastAnswerMS, sc.LastAnswerMS))
	fmt.Fprintf(&b, "| webhooks answered 200 / sent | %d / %d%s | %d / %d%s | |\n", nc.OK, nc.Webhooks, errSuffix(nc.Errors), sc.OK, sc.Webhooks, errSuffix(sc.Errors))
	fmt.Fprintf(&b, "| **webhook p50** | %s | %s | %s |\n", dur(nc.P50MS), dur(sc.P50MS), ratio(nc.P50MS, sc.P50MS))
	fmt.Fprintf(&b, "| **webhook p99** | %s | %s | %s |\n", dur(nc.P99MS), dur(sc.P99MS), ratio(nc.P99MS, sc.P99MS))
	fmt.Fprintf(&b, "| **CPU per webhook, service + mariadbd** | %.3f ms | %.3f ms | %s |\n", nc.cpuPerWebhook(true, true), sc.cpuPerWebhook(true, true),
		ratio(nc.cpuPerWebhook(true, true), sc.cpuPerWebhook(true, true)))
	fmt.Fprintf(&b, "| … the service | %.3f ms (%s) | %.3f ms (%s) | %s |\n", nc.cpuPerWebhook(true, false), split(nc), sc.cpuPerWebhook(true, false), split(sc),
		ratio(nc.cpuPerWebhook(true, false), sc.cpuPerWebhook(true, false)))
	fmt.Fprintf(&b, "| … mariadbd | %.3f ms | %.3f ms | %s |\n", nc.cpuPerWebhook(false, true), sc.cpuPerWebhook(false, true),
		ratio(nc.cpuPerWebhook(false, true), sc.cpuPerWebhook(false, true)))
	fmt.Fprintf(&b, "| CPU seconds: service processes | %s | %s | %s |\n", procs(nc), procs(sc), ratio(nc.cpuMS(true, false), sc.cpuMS(true, false)))
	fmt.Fprintf(&b, "| CPU seconds: mariadbd | %s | %s | %s |\n", sec(nc.CPU["mariadbd"]), sec(sc.CPU["mariadbd"]), ratio(nc.CPU["mariadbd"], sc.CPU["mariadbd"]))
	fmt.Fprintf(&b, "| CPU seconds: the bench process (sender, fake NanoMDM, receiver; not counted) | %s | %s | |\n", sec(nc.CPU["bench"]), sec(sc.CPU["bench"]))
	fmt.Fprintf(&b, "| window (release to the end of the CPU and statement window) | %s | %s | |\n", dur(nc.WindowMS), dur(sc.WindowMS))
	for _, k := range statementKinds {
		a, c := nc.perResult(k.vars...), sc.perResult(k.vars...)
		fmt.Fprintf(&b, "| statements per result: %s | %.2f | %.2f | %s |\n", k.label, a, c, ratio(a, c))
	}
	fmt.Fprintf(&b, "| statements per result: other (`Questions` less the above: SET, a connection's QUIT, …) | %.2f | %.2f | %s |\n", nc.otherStatements(), sc.otherStatements(), ratio(nc.otherStatements(), sc.otherStatements()))
	fmt.Fprintf(&b, "| **statements per result: all** (`Questions`) | %.2f | %.2f | %s |\n", nc.perResult("Questions"), sc.perResult("Questions"),
		ratio(nc.perResult("Questions"), sc.perResult("Questions")))
	fmt.Fprintf(&b, "| prepares per result (`Com_stmt_prepare`; executions counted above) | %.2f | %.2f | %s |\n", nc.perResult("Com_stmt_prepare"), sc.perResult("Com_stmt_prepare"),
		ratio(nc.perResult("Com_stmt_prepare"), sc.perResult("Com_stmt_prepare")))
	fmt.Fprintf(&b, "| connections opened per result (`Connections`) | %.2f | %.2f | %s |\n", nc.perResult("Connections"), sc.perResult("Connections"),
		ratio(nc.perResult("Connections"), sc.perResult("Connections")))
	fmt.Fprintf(&b, "| left behind: steps / id_commands / step_commands | %d / %d / %d | %d / %d / %d | |\n\n",
		nc.Stranded.Steps, nc.Stranded.IDCommands, nc.Stranded.StepCommands, sc.Stranded.Steps, sc.Stranded.IDCommands, sc.Stranded.StepCommands)
	if sc.EventsReceived > sc.EventsDistinct || sc.OutboxLeft > 0 {
		fmt.Fprintf(&b, "stepcollect: %s events received / distinct, %d left in the outbox at the end of the window.\n\n",
			eventsString(sc.EventsReceived, sc.EventsDistinct), sc.OutboxLeft)
	}
	b.WriteString(e.goals())
	b.WriteString("\n")

	b.WriteString("### Where the CPU goes\n\n")
	for _, r := range e.Runs {
		if r.ProfileNote != "" {
			fmt.Fprintf(&b, "%s: %s\n\n", r.Impl, strings.TrimSpace(r.ProfileNote))
		}
		for _, p := range r.Profiles {
			fmt.Fprintf(&b, "%s's `%s`, the whole life of the process (the `POST /v1/steps` and the webhooks), `go tool pprof -top -nodecount=10` "+
				"(flat: time in the function itself), from `%s`:\n\n```\n%s\n```\n\n", r.Impl, p.Process, p.Path, strings.TrimSpace(p.Top))
		}
	}
	return b.String()
}

// goals are the section's two goal lines.
func (e *e2eResult) goals() string {
	if len(e.Runs) != 2 {
		return ""
	}
	nc, sc := e.Runs[0], e.Runs[1]
	var b strings.Builder
	verdict := "missed"
	detail := ""
	switch {
	case sc.DoneMS == 0:
		detail = "stepcollect did not finish within the wait"
	case nc.DoneMS == 0:
		verdict, detail = "met", fmt.Sprintf("stepcollect %s; NanoCMD did not finish within the wait", dur(sc.DoneMS))
	default:
		x := sc.DoneMS / nc.DoneMS
		if x <= 0.5 && sc.OK == sc.Webhooks {
			verdict = "met"
		}
		detail = fmt.Sprintf("%s vs %s, %.2f× NanoCMD's time", dur(sc.DoneMS), dur(nc.DoneMS), x)
	}
	fmt.Fprintf(&b, "- **End to end at N=%d: every enrollment done in at most half of NanoCMD's time** (%s): %s: **%s**.\n", e.N, e.Server, detail, verdict)
	cpu := sc.cpuPerWebhook(true, true)
	verdict = "met"
	if cpu > 1.5 || sc.Webhooks == 0 || e.Shared {
		verdict = "missed"
	}
	if e.Shared {
		verdict = "not judged: a shared server's CPU is not measured"
	}
	fmt.Fprintf(&b, "- **End to end at N=%d: at most 1.5 ms CPU per webhook** (stepcollect, service + mariadbd): %.3f ms (NanoCMD v0.7.1: %.3f ms): **%s**.\n",
		e.N, cpu, nc.cpuPerWebhook(true, true), verdict)
	return b.String()
}

func errSuffix(m map[string]int) string {
	if sum(m) == 0 {
		return ""
	}
	return " (" + errString(m) + ")"
}
