// probe-ops measures what one statement of the result path costs the
// database server and its client, 64 at a time on 64 connections, against
// the bench's floor (a single-row autocommit UPDATE of the row's own key):
// each mode runs n of one statement over n id_commands rows of one step
// (or, "/spread", of 64 steps), on a fresh database made by stepcollect's
// own migrations, the modes alternated round by round. Both CPUs come
// from /proc (the server's by -pid), counted until 300 ms after the last
// answer (the purge that follows). MariaDB and MySQL alike.
//
//	cd bench && go run ./cmd/probe-ops -pid $(pgrep -x mariadbd) -n 10000 -rounds 4 \
//	    -modes update,call,delete,insert,insertsmall,select,delete/noidx
//
// A mode is a statement (modes below), optionally /<variant>: noidx, nolp
// and nostep drop id_commands' secondary indexes (both, last_push's,
// step_id's with its foreign key); nsarg and pk rewrite the completion's
// DELETE without a range on step_id (step_id + 0, or no step_id at all);
// spread gives the rows 64 steps instead of one; nouniq drops the
// outbox's unique event_id key; varbin makes the outbox's payload a
// VARBINARY(4000), not a LONGBLOB; prepared sends the statement as a
// server-side prepared statement (binary protocol, prepared once a
// connection) instead of interpolated text. The modes updres and
// updsmall are the completion in place, as NanoCMD keeps results: the
// enrollment's row updated by key with the event (or one byte) as its
// result, autocommit, no outbox row.
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/stepcollect/stepcollect/internal/testkit"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

var modes = map[string]string{
	"call":        `CALL stepcollect_complete_single(?, ?, ?, ?, ?, ?)`,
	"update":      `UPDATE id_commands SET completed = 1 WHERE enrollment_id = ? AND command_uuid = ?`,
	"delete":      `DELETE FROM id_commands WHERE enrollment_id = ? AND command_uuid = ? AND step_id = ? AND completed = 0`,
	"insert":      `INSERT INTO stepcollect_outbox (event_id, event_type, step_id, enrollment_id, payload) VALUES (?, ?, ?, ?, ?)`,
	"insertsmall": `INSERT INTO stepcollect_outbox (event_id, event_type, step_id, enrollment_id, payload) VALUES (?, ?, ?, ?, 'x')`,
	"updres":      `UPDATE id_commands SET completed = 1, result = ? WHERE enrollment_id = ? AND command_uuid = ? AND step_id = ? AND completed = 0`,
	"updsmall":    `UPDATE id_commands SET completed = 1, result = 'x' WHERE enrollment_id = ? AND command_uuid = ? AND step_id = ? AND completed = 0`,
	"select":      `SELECT completed FROM id_commands WHERE enrollment_id = ? AND command_uuid = ?`,
}

func main() {
	dsn := flag.String("dsn", "root@tcp(127.0.0.1:3306)/", "the server, without a database")
	pid := flag.Int("pid", 0, "the server's pid")
	n := flag.Int("n", 10000, "ops a mode")
	conc := flag.Int("c", 64, "at once")
	rounds := flag.Int("rounds", 3, "rounds, the modes alternated")
	size := flag.Int("payload", 640, "the event's bytes")
	which := flag.String("modes", "update,call", "")
	flag.Parse()
	admin, err := sql.Open("mysql", *dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Exec(`DROP DATABASE IF EXISTS callprobe`)
	payload := strings.Repeat(`{"x":"abcdefghijklmnopqrstuvwxyz\"0123456789"}`, *size/46+1)[:*size]
	for r := 1; r <= *rounds; r++ {
		for _, m := range strings.Split(*which, ",") {
			wall, server, client := measure(admin, *dsn, *pid, *n, *conc, m, payload)
			fmt.Printf("%-14s %6.0f ms  server %5.0f µs  client %5.0f µs an op  (round %d)\n", m, float64(wall.Milliseconds()), server, client, r)
		}
	}
}

func measure(admin *sql.DB, dsn string, pid, n, conc int, mode string, payload string) (time.Duration, float64, float64) {
	ctx := context.Background()
	must(admin.Exec(`DROP DATABASE IF EXISTS callprobe`))
	must(admin.Exec(`CREATE DATABASE callprobe`))
	db, err := sql.Open("mysql", strings.Replace(dsn, ")/", ")/callprobe", 1)+"?interpolateParams=true&multiStatements=true")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(conc)
	db.SetMaxIdleConns(conc)
	if err := stepmysql.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	base, strip, _ := strings.Cut(mode, "/")
	switch strip {
	case "noidx":
		must(db.Exec(`ALTER TABLE id_commands DROP FOREIGN KEY id_commands_ibfk_1`))
		must(db.Exec(`ALTER TABLE id_commands DROP INDEX step_id, DROP INDEX last_push`))
	case "nolp":
		must(db.Exec(`ALTER TABLE id_commands DROP INDEX last_push`))
	case "nostep":
		must(db.Exec(`ALTER TABLE id_commands DROP FOREIGN KEY id_commands_ibfk_1`))
		must(db.Exec(`ALTER TABLE id_commands DROP INDEX step_id`))
	case "nsarg", "pk":
		cond := "step_id + 0 = p_step"
		if strip == "pk" {
			cond = "1 = 1"
		}
		must(db.Exec(`DROP PROCEDURE stepcollect_complete_single`))
		must(db.Exec(`CREATE PROCEDURE stepcollect_complete_single(
    IN p_enrollment VARCHAR(255), IN p_command VARCHAR(127), IN p_step BIGINT,
    IN p_event_id VARCHAR(64), IN p_event_type VARCHAR(32), IN p_payload LONGBLOB)
    MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN
    START TRANSACTION;
    DELETE FROM id_commands
    WHERE enrollment_id = p_enrollment AND command_uuid = p_command
      AND ` + cond + ` AND completed = 0;
    INSERT INTO stepcollect_outbox (event_id, event_type, step_id, enrollment_id, payload)
    VALUES (IF(ROW_COUNT() = 1, p_event_id, NULL), p_event_type, p_step, p_enrollment, p_payload);
    COMMIT;
END`))
	case "nouniq":
		must(db.Exec(`ALTER TABLE stepcollect_outbox DROP INDEX outbox_event_id`))
	case "varbin":
		must(db.Exec(`ALTER TABLE stepcollect_outbox MODIFY payload VARBINARY(4000) NOT NULL`))
	case "spread", "prepared":
		// spread: the same two indexes, the rows' step ids over 64 steps;
		// prepared: the schema as migrated
	}
	// rows inserted a thousand a statement, so that MySQL (without
	// MariaDB's sequence engine) runs it too
	var steps []string
	for i := 1; i <= 64; i++ {
		steps = append(steps, fmt.Sprintf("(%d, 'w', 'i')", i))
	}
	must(db.Exec(`INSERT INTO steps (id, workflow_name, instance_id) VALUES ` + strings.Join(steps, ",")))
	for lo := int64(1); lo <= int64(n); lo += 1000 {
		var rows []string
		for k := lo; k < lo+1000 && k <= int64(n); k++ {
			rows = append(rows, fmt.Sprintf("('E%d', 'C', %d, 'DeviceInformation')", k, step(strip, k)))
		}
		must(db.Exec(`INSERT INTO id_commands (enrollment_id, command_uuid, step_id, request_type) VALUES ` + strings.Join(rows, ",")))
	}
	q := modes[base]
	// every connection open (and its statement prepared) before the clock
	conns := make([]*sql.Conn, conc)
	stmts := make([]*sql.Stmt, conc)
	for i := range conns {
		c, err := db.Conn(ctx)
		if err != nil {
			log.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
		if strip == "prepared" {
			if stmts[i], err = c.PrepareContext(ctx, q); err != nil {
				log.Fatal(err)
			}
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	time.Sleep(500 * time.Millisecond)
	s0, c0 := serverCPU(pid), selfCPU()
	t0 := time.Now()
	for i := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := next.Add(1); k <= int64(n); k = next.Add(1) {
				e := "E" + strconv.FormatInt(k, 10)
				ev := "ev-" + strconv.FormatInt(k, 10)
				var args []any
				switch base {
				case "call":
					args = []any{e, "C", step(strip, k), ev, "step.completed", []byte(payload)}
				case "updres":
					args = []any{[]byte(payload), e, "C", step(strip, k)}
				case "updsmall":
					args = []any{e, "C", step(strip, k)}
				case "update", "select":
					args = []any{e, "C"}
				case "delete":
					args = []any{e, "C", step(strip, k)}
				case "insert":
					args = []any{ev, "step.completed", int64(1), e, []byte(payload)}
				case "insertsmall":
					args = []any{ev, "step.completed", int64(1), e}
				}
				switch {
				case base == "select":
					var row *sql.Row
					if stmts[i] != nil {
						row = stmts[i].QueryRowContext(ctx, args...)
					} else {
						row = conns[i].QueryRowContext(ctx, q, args...)
					}
					var c int
					if err := row.Scan(&c); err != nil {
						log.Fatal(err)
					}
				case stmts[i] != nil:
					must(stmts[i].ExecContext(ctx, args...))
				default:
					must(conns[i].ExecContext(ctx, q, args...))
				}
			}
		}()
	}
	wg.Wait()
	wall := time.Since(t0)
	time.Sleep(300 * time.Millisecond) // purge that follows
	return wall, (serverCPU(pid) - s0) * 1000 / float64(n), (selfCPU() - c0) * 1000 / float64(n)
}

func step(strip string, k int64) int64 {
	if strip == "spread" {
		return 1 + k%64
	}
	return 1
}

// serverCPU is the server's CPU time so far, in ms.
func serverCPU(pid int) float64 { return cpuMS(pid) }

// selfCPU is this process's CPU time so far, in ms.
func selfCPU() float64 { return cpuMS(os.Getpid()) }

func cpuMS(pid int) float64 {
	d, err := testkit.ProcessCPU(pid)
	if err != nil {
		log.Fatal(err)
	}
	return float64(d.Microseconds()) / 1000
}

func must(_ sql.Result, err error) {
	if err != nil {
		log.Fatal(err)
	}
}
