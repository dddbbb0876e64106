//go:build ignore

// inserts measures what one INSERT costs the database server, 64 at a
// time, by the shape of the table's keys, against the floor's single-row
// UPDATE: the server's CPU a statement (from /proc, -pid) and its futex
// calls a statement (perf stat, when perf is installed). Every mode gets a
// fresh database (hotkey_probe, dropped after); MariaDB only (the floor's
// rows come from the sequence engine).
//
//	go run docs/bench/outbox-key-2026-12-06/inserts.go -dsn 'root@tcp(127.0.0.1:3306)/' \
//	    -pid $(pgrep -x mariadbd) -n 10000 -rounds 3
//
// Modes, each n autocommitted statements, 64 at a time:
//
//	floor      UPDATE f SET v = v + 1 WHERE id = ?, the bench's floor
//	outbox     INSERT into stepcollect_outbox as stepcollect's migrations
//	           make it (AUTO_INCREMENT key, unique event_id,
//	           outbox_held_at), a 640-byte payload
//	noheld     the same without outbox_held_at
//	autoinc    INSERT into a table of an AUTO_INCREMENT key, event_id,
//	           enrollment_id and the payload, no other index
//	clientseq  the same table, the key given by the client in ascending
//	           order (no AUTO_INCREMENT: its lock is not the cost)
//	random     the same table, a random BIGINT key
//	shard8     the key (shard, id) with eight shards and id AUTO_INCREMENT
//	           (which must lead an index of its own)
package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/go-sql-driver/mysql"

	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// a mode is its table and its statement; arg gives the statement's
// parameters for the k-th statement (1-based) and 16 random bytes. An
// empty ddl is the outbox as stepcollect's own migrations make it, then
// alter, if any.
type mode struct {
	ddl, alter, stmt string
	arg              func(k int64, r []byte, payload string) []any
}

var modes = map[string]mode{
	"floor": {`CREATE TABLE t (id INT NOT NULL PRIMARY KEY, v BIGINT NOT NULL DEFAULT 0)`, "",
		`UPDATE t SET v = v + 1 WHERE id = ?`,
		func(k int64, _ []byte, _ string) []any { return []any{k} }},
	"outbox": {"", "", outboxInsert, outboxArgs},
	"noheld": {"", `ALTER TABLE stepcollect_outbox DROP INDEX outbox_held_at`, outboxInsert, outboxArgs},
	"autoinc": {`CREATE TABLE t (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, event_id VARCHAR(64) NOT NULL, enrollment_id VARCHAR(255), payload LONGBLOB NOT NULL)`, "",
		`INSERT INTO t (event_id, enrollment_id, payload) VALUES (?, ?, ?)`,
		func(_ int64, r []byte, p string) []any {
			return []any{hex.EncodeToString(r), hex.EncodeToString(r[:6]), p}
		}},
	"clientseq": {keyedDDL, "", keyedInsert,
		func(k int64, r []byte, p string) []any {
			return []any{k, hex.EncodeToString(r), hex.EncodeToString(r[:6]), p}
		}},
	"random": {keyedDDL, "", keyedInsert,
		func(_ int64, r []byte, p string) []any {
			return []any{int64(binary.LittleEndian.Uint64(r[8:]) >> 2), hex.EncodeToString(r), hex.EncodeToString(r[:6]), p}
		}},
	"shard8": {`CREATE TABLE t (shard TINYINT NOT NULL, id BIGINT NOT NULL AUTO_INCREMENT, event_id VARCHAR(64) NOT NULL, enrollment_id VARCHAR(255), payload LONGBLOB NOT NULL, PRIMARY KEY (shard, id), KEY (id))`, "",
		`INSERT INTO t (shard, event_id, enrollment_id, payload) VALUES (?, ?, ?, ?)`,
		func(_ int64, r []byte, p string) []any {
			return []any{int(r[7] % 8), hex.EncodeToString(r), hex.EncodeToString(r[:6]), p}
		}},
}

const (
	outboxInsert = `INSERT INTO stepcollect_outbox (event_id, event_type, step_id, enrollment_id, payload) VALUES (?, 'step.completed', 1, ?, ?)`
	keyedDDL     = `CREATE TABLE t (id BIGINT NOT NULL PRIMARY KEY, event_id VARCHAR(64) NOT NULL, enrollment_id VARCHAR(255), payload LONGBLOB NOT NULL)`
	keyedInsert  = `INSERT INTO t (id, event_id, enrollment_id, payload) VALUES (?, ?, ?, ?)`
)

func outboxArgs(_ int64, r []byte, p string) []any {
	return []any{hex.EncodeToString(r), hex.EncodeToString(r[:6]), p}
}

func main() {
	dsn := flag.String("dsn", "root@tcp(127.0.0.1:3306)/", "server DSN, no database")
	pid := flag.Int("pid", 0, "the server's process id, for its CPU and futex calls")
	n := flag.Int("n", 10000, "statements a measurement")
	conc := flag.Int("c", 64, "statements at once")
	rounds := flag.Int("rounds", 3, "every mode this many times, alternated")
	list := flag.String("modes", "floor,outbox,noheld,autoinc,clientseq,random,shard8", "comma-separated (see the comment)")
	flag.Parse()
	if *pid == 0 {
		log.Fatal("-pid: the server's process id is needed for its CPU")
	}
	admin, err := sql.Open("mysql", *dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Exec(`DROP DATABASE IF EXISTS hotkey_probe`)
	payload := strings.Repeat("x", 640)
	fmt.Printf("%-10s %8s %14s %14s\n", "mode", "wall", "server CPU", "futex calls")
	for r := 1; r <= *rounds; r++ {
		for _, name := range strings.Split(*list, ",") {
			m, ok := modes[name]
			if !ok {
				log.Fatalf("-modes: no mode %q", name)
			}
			wall, cpu, futex := measure(admin, *dsn, *pid, *n, *conc, m, payload)
			fmt.Printf("%-10s %6.0f ms %8.0f µs/st %8s /st   (round %d)\n", name, float64(wall.Milliseconds()), cpu, futex, r)
		}
	}
}

func measure(admin *sql.DB, dsn string, pid, n, conc int, m mode, payload string) (time.Duration, float64, string) {
	must(admin.Exec(`DROP DATABASE IF EXISTS hotkey_probe`))
	must(admin.Exec(`CREATE DATABASE hotkey_probe`))
	db, err := sql.Open("mysql", strings.Replace(dsn, ")/", ")/hotkey_probe", 1)+"?interpolateParams=true")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(conc)
	db.SetMaxIdleConns(conc)
	if m.ddl == "" {
		if err := stepmysql.Migrate(context.Background(), db); err != nil {
			log.Fatal(err)
		}
		if m.alter != "" {
			must(db.Exec(m.alter))
		}
	} else {
		must(db.Exec(m.ddl))
	}
	if strings.HasPrefix(m.stmt, "UPDATE") {
		must(db.Exec(`INSERT INTO t (id) SELECT seq FROM seq_1_to_` + strconv.Itoa(n)))
	}
	var wg sync.WaitGroup
	for range conc { // every connection open before the clock starts
		wg.Add(1)
		go func() { defer wg.Done(); must(db.Exec(`SELECT 1`)) }()
	}
	wg.Wait()
	var perf *exec.Cmd
	out, _ := os.CreateTemp("", "inserts-perf")
	out.Close()
	defer os.Remove(out.Name())
	if _, err := exec.LookPath("perf"); err == nil {
		perf = exec.Command("perf", "stat", "-x", ",", "-e", "syscalls:sys_enter_futex", "-p", strconv.Itoa(pid), "-o", out.Name())
		if perf.Start() != nil {
			perf = nil
		}
		time.Sleep(300 * time.Millisecond)
	}
	var next atomic.Int64
	c0 := serverCPU(pid)
	t0 := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := make([]byte, 16)
			for k := next.Add(1); k <= int64(n); k = next.Add(1) {
				rand.Read(r)
				must(db.Exec(m.stmt, m.arg(k, r, payload)...))
			}
		}()
	}
	wg.Wait()
	wall := time.Since(t0)
	cpu := (serverCPU(pid) - c0) * 1000 / float64(n)
	futex := "-"
	if perf != nil {
		perf.Process.Signal(os.Interrupt)
		perf.Wait()
		b, _ := os.ReadFile(out.Name())
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "futex") {
				if v, err := strconv.ParseFloat(strings.Split(l, ",")[0], 64); err == nil {
					futex = fmt.Sprintf("%.1f", v/float64(n))
				}
			}
		}
	}
	return wall, cpu, futex
}

// serverCPU is the process's user and system CPU in ms (100 ticks a second).
func serverCPU(pid int) float64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		log.Fatal(err)
	}
	f := strings.Fields(string(b)[strings.LastIndexByte(string(b), ')')+2:])
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) * 10
}

func must(_ sql.Result, err error) {
	if err != nil {
		log.Fatal(err)
	}
}
