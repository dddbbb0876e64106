//go:build ignore

// statements measures what single statements of the result path and of
// delivery cost the database server, alone, 64 at a time, against the
// floor's single-row UPDATE: the server's CPU (from /proc, -pid) and this
// process's, a statement or an event. Each measurement gets a fresh
// migrated database (MariaDB only: the floor's table is filled from the
// sequence engine), dropped after.
//
//	go run docs/bench/outbox-2026-12-03/statements.go -dsn 'root@tcp(127.0.0.1:3310)/' -pid <mariadbd's> \
//	    -n 10000 -rounds 3 -modes floor,text,prepared,insert,insert-small
//
// Modes, one step of one command to n enrollments stored first:
//
//	floor          UPDATE f SET v = v + 1 WHERE id = ? (autocommit)
//	text           CALL stepcollect_complete_single(…), parameters interpolated (the api's way)
//	prepared       the same CALL as a server-side prepared statement, one a connection
//	delete         the completion's DELETE of the result's id_commands row, alone
//	insert         the event's outbox INSERT alone (a 640-byte payload)
//	insert-small   the same with a 10-byte payload
//	insert-nouniq  the same without the outbox_event_id unique index
//	ins-auto       INSERT into a two-column table with an AUTO_INCREMENT key
//	ins-rand       INSERT into a two-column table with keys spread out
//	life<size>     text with a <size>-byte payload, then every event claimed
//	               (the worker's claim and lease, 60 at a time, -claimers at
//	               once), then deleted 24 at a time, each phase timed apart
//	lifei<size>    the same, each claimer deleting its batch before claiming
//	               again, as the worker's loops do
//	lifet<size>    the same, the claim held in its transaction (no lease
//	               UPDATE) and the batch deleted in it before its COMMIT: a
//	               delivery whose lock is its lease
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
	"syscall"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"

	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

var claimers int

func main() {
	base := flag.String("dsn", "root@tcp(127.0.0.1:3310)/", "server DSN, no database")
	pid := flag.Int("pid", 0, "the server's process id, for its CPU")
	n := flag.Int("n", 10000, "enrollments, statements or events a measurement")
	rounds := flag.Int("rounds", 3, "every mode this many times, alternated")
	flag.IntVar(&claimers, "claimers", 2, "life modes: claims at once")
	modes := flag.String("modes", "text,prepared", "comma-separated (see the comment)")
	flag.Parse()
	ctx := context.Background()
	for r := range *rounds {
		for _, mode := range strings.Split(*modes, ",") {
			run(ctx, *base, *pid, *n, mode, r)
		}
	}
}

// The CALL's event, about as long as the bench's step.completed.
var event = []byte(strings.Repeat(`{"event_id":"x","type":"step.completed","step":{"commands":[{"result":"PD94bWwgdmVyc2lvbj0iMS4wIiBlbmNvZGluZz0iVVRGLTgiPz48cGxpc3Q="}]}}`, 5))

const call = "CALL stepcollect_complete_single(?, ?, ?, ?, ?, ?)"

func run(ctx context.Context, base string, pid, n int, mode string, r int) {
	name := strings.ReplaceAll(fmt.Sprintf("exp_%s_%d", mode, r), "-", "_")
	root, err := sql.Open("mysql", base)
	if err != nil {
		log.Fatal(err)
	}
	defer root.Close()
	must(root.Exec("DROP DATABASE IF EXISTS " + name))
	must(root.Exec("CREATE DATABASE " + name))
	defer root.Exec("DROP DATABASE " + name)
	db, err := stepmysql.OpenDB(base + name + "?sql_log_bin=0")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(128)
	db.SetMaxIdleConns(128)
	if err := stepmysql.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	st, err := stepmysql.New(stepmysql.WithDB(db))
	if err != nil {
		log.Fatal(err)
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("ENR-%06d", i)
	}
	step := &nanostorage.StepEnqueuingWithConfig{StepEnqueueing: nanostorage.StepEnqueueing{
		IDs: ids, StepContext: nanostorage.StepContext{WorkflowName: "w", InstanceID: "i", Name: "s"},
		Commands: []nanostorage.StepCommandRaw{{CommandUUID: "CMD-1", RequestType: "DeviceInformation", Command: []byte("<plist/>")}},
	}}
	sid, err := st.StoreStepID(ctx, step, time.Now())
	if err != nil {
		log.Fatal(err)
	}
	payload := event
	if strings.HasPrefix(mode, "life") {
		size, err := strconv.Atoi(strings.TrimLeft(strings.TrimPrefix(mode, "life"), "it"))
		if err != nil || size > len(event) {
			log.Fatalf("mode %s: want life<size>, lifei<size> or lifet<size>, size at most %d", mode, len(event))
		}
		payload = event[:size]
	}
	must(db.Exec("CREATE TABLE f (id INT PRIMARY KEY, v INT NOT NULL DEFAULT 0)"))
	must(db.Exec("INSERT INTO f (id) SELECT seq FROM seq_0_to_20000"))
	must(db.Exec("CREATE TABLE g (id BIGINT AUTO_INCREMENT PRIMARY KEY, v INT NOT NULL)"))
	must(db.Exec("CREATE TABLE h (id BIGINT PRIMARY KEY, v INT NOT NULL)"))
	if mode == "insert-nouniq" {
		must(db.Exec("ALTER TABLE stepcollect_outbox DROP INDEX outbox_event_id"))
	}
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	time.Sleep(2 * time.Second) // the step's purge
	s0, c0, t0 := procCPU(pid), selfCPU(), time.Now()
	var wg sync.WaitGroup
	var failed sync.Map
	for range 64 {
		wg.Go(func() {
			conn, err := db.Conn(ctx)
			if err != nil {
				log.Fatal(err)
			}
			defer conn.Close()
			var stmt *sql.Stmt
			if mode == "prepared" {
				if stmt, err = conn.PrepareContext(ctx, call); err != nil {
					log.Fatal(err)
				}
				defer stmt.Close()
			}
			for i := range next {
				args := []any{ids[i], "CMD-1", sid, fmt.Sprintf("ev-%d-%d", r, i), "step.completed", payload}
				switch mode {
				case "floor":
					_, err = conn.ExecContext(ctx, "UPDATE f SET v = v + 1 WHERE id = ?", i)
				case "delete":
					_, err = conn.ExecContext(ctx, "DELETE FROM id_commands WHERE enrollment_id = ? AND command_uuid = ? AND step_id = ? AND completed = 0", ids[i], "CMD-1", sid)
				case "ins-auto":
					_, err = conn.ExecContext(ctx, "INSERT INTO g (v) VALUES (?)", i)
				case "ins-rand":
					_, err = conn.ExecContext(ctx, "INSERT INTO h (id, v) VALUES (?, ?)", (i*7919)%100003, i)
				case "insert", "insert-nouniq", "insert-small":
					p := payload
					if mode == "insert-small" {
						p = payload[:10]
					}
					_, err = conn.ExecContext(ctx, "INSERT INTO stepcollect_outbox (event_id, event_type, step_id, enrollment_id, payload) VALUES (?, ?, ?, ?, ?)", args[3], args[4], sid, ids[i], p)
				case "prepared":
					_, err = stmt.ExecContext(ctx, args...)
				default: // text, life…
					_, err = conn.ExecContext(ctx, call, args...)
				}
				if err != nil {
					failed.Store(i, err)
				}
			}
		})
	}
	wg.Wait()
	p1 := procCPU(pid)
	if strings.HasPrefix(mode, "life") {
		deliver(ctx, db, pid, n, mode, s0, p1)
	}
	wall := time.Since(t0)
	s1, c1 := procCPU(pid), selfCPU()
	var left int
	must1(db.QueryRow("SELECT COUNT(*) FROM id_commands").Scan(&left))
	errs := 0
	failed.Range(func(k, v any) bool {
		if errs++; errs == 1 {
			log.Print(v)
		}
		return true
	})
	fmt.Printf("%-13s round %d wall %6.0f ms  client %5.1f µs/op  server %5.1f µs/op  id_commands left %d  errors %d\n", mode, r,
		float64(wall.Microseconds())/1e3, float64(c1-c0)/float64(n)/1e3, float64(s1-s0)/float64(n)/1e3, left, errs)
}

// deliver claims every event as the worker does (claim and lease in one
// transaction, 60 at a time) and deletes them 24 at a time; lifei deletes
// each batch before its claimer claims again, life claims them all first.
func deliver(ctx context.Context, db *sql.DB, pid, n int, mode string, s0, p1 time.Duration) {
	interleave := strings.HasPrefix(mode, "lifei")
	held := strings.HasPrefix(mode, "lifet")
	counters0 := counters(db)
	var mu sync.Mutex
	var all [][]string
	del := func(ids []string) {
		for len(ids) > 0 {
			k := min(24, len(ids))
			must(db.ExecContext(ctx, "DELETE FROM stepcollect_outbox WHERE id IN ("+strings.Join(ids[:k], ",")+")"))
			ids = ids[k:]
		}
	}
	var wg sync.WaitGroup
	for range claimers {
		wg.Go(func() {
			for {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					log.Fatal(err)
				}
				rows, err := tx.QueryContext(ctx, "SELECT id, event_id, payload FROM stepcollect_outbox FORCE INDEX (outbox_held_at) WHERE held_at IS NULL AND (lease_until IS NULL OR lease_until <= NOW(6)) ORDER BY id LIMIT 60 FOR UPDATE SKIP LOCKED")
				if err != nil {
					log.Fatal(err)
				}
				var ids []string
				for rows.Next() {
					var id int64
					var ev string
					var pl []byte
					must1(rows.Scan(&id, &ev, &pl))
					ids = append(ids, strconv.FormatInt(id, 10))
				}
				rows.Close()
				if len(ids) == 0 {
					tx.Rollback()
					return
				}
				if held {
					// the POSTs would run here, the rows locked by this
					// transaction; what was acknowledged goes with its COMMIT
					for b := ids; len(b) > 0; b = b[min(24, len(b)):] {
						if _, err := tx.ExecContext(ctx, "DELETE FROM stepcollect_outbox WHERE id IN ("+strings.Join(b[:min(24, len(b))], ",")+")"); err != nil {
							log.Fatal(err)
						}
					}
					must1(tx.Commit())
					continue
				}
				if _, err := tx.ExecContext(ctx, "UPDATE stepcollect_outbox SET attempts = attempts + 1, lease_until = NOW(6) + INTERVAL 30 SECOND, retry_at = NULL WHERE id IN ("+strings.Join(ids, ",")+")"); err != nil {
					log.Fatal(err)
				}
				must1(tx.Commit())
				if interleave {
					del(ids)
					continue
				}
				mu.Lock()
				all = append(all, ids)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	p2 := procCPU(pid)
	for name, v := range counters(db) {
		fmt.Printf("  %s %.1f an event\n", name, float64(v-counters0[name])/float64(n))
	}
	batches := make(chan []string, len(all))
	for _, ids := range all {
		batches <- ids
	}
	close(batches)
	for range 2 {
		wg.Go(func() {
			for ids := range batches {
				del(ids)
			}
		})
	}
	wg.Wait()
	p3 := procCPU(pid)
	time.Sleep(1500 * time.Millisecond) // the deleted rows' purge
	p4 := procCPU(pid)
	per := func(d time.Duration) float64 { return float64(d) / float64(n) / 1e3 }
	fmt.Printf("  %s, %d claiming at once: server µs an event: CALL %.0f, claim and lease %.0f, delete %.0f, purge %.0f\n",
		mode, claimers, per(p1-s0), per(p2-p1), per(p3-p2), per(p4-p3))
}

// counters are the server's row and page reads so far (every session's).
func counters(db *sql.DB) map[string]int64 {
	out := map[string]int64{}
	rows, err := db.Query("SHOW GLOBAL STATUS WHERE Variable_name IN ('Handler_read_key', 'Handler_read_next', 'Innodb_buffer_pool_read_requests')")
	if err != nil {
		log.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var v int64
		must1(rows.Scan(&name, &v))
		out[name] = v
	}
	return out
}

func must(_ sql.Result, err error) {
	if err != nil {
		log.Fatal(err)
	}
}

func must1(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

// selfCPU is this process's CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU is process pid's CPU time so far (user and system), 0 for pid 0.
func procCPU(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		log.Fatal(err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	u, _ := strconv.Atoi(f[11])
	k, _ := strconv.Atoi(f[12])
	return time.Duration(u+k) * 10 * time.Millisecond // USER_HZ 100
}
