//go:build ignore

// calls measures what a one-command completion costs the database server
// and its client, 64 at a time, sent two ways: as the api sends it today
// (CALL stepcollect_complete_single with its arguments interpolated into
// the query text, the text protocol) and as a server-side prepared
// statement executed with bound arguments (the binary protocol, prepared
// once a connection). The server's CPU a completion comes from /proc
// (-pid), the client's from its own rusage. Every round of every mode
// gets a fresh database (callprobe, dropped after) migrated by
// stepcollect's own migrations, with one step of n enrollments and one
// command each; MariaDB only (the rows come from the sequence engine).
//
//	go run docs/bench/prepared-2026-12-07/calls.go -dsn 'root@tcp(127.0.0.1:3306)/' \
//	    -pid $(pgrep -x mariadbd) -n 10000 -rounds 3
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
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql"

	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

const call = `CALL stepcollect_complete_single(?, ?, ?, ?, ?, ?)`

func main() {
	dsn := flag.String("dsn", "root@tcp(127.0.0.1:3306)/", "the server, without a database")
	pid := flag.Int("pid", 0, "the server's pid")
	n := flag.Int("n", 10000, "completions a mode")
	conc := flag.Int("c", 64, "at once")
	rounds := flag.Int("rounds", 3, "rounds, the modes alternated")
	size := flag.Int("payload", 640, "the event's bytes")
	flag.Parse()
	admin, err := sql.Open("mysql", *dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Exec(`DROP DATABASE IF EXISTS callprobe`)
	payload := strings.Repeat(`{"x":"abcdefghijklmnopqrstuvwxyz\"0123456789"}`, *size/46+1)[:*size]
	for r := 1; r <= *rounds; r++ {
		for _, prepared := range []bool{false, true} {
			wall, server, client := measure(admin, *dsn, *pid, *n, *conc, prepared, payload)
			name := "text"
			if prepared {
				name = "prepared"
			}
			fmt.Printf("%-9s %6.0f ms  server %5.0f µs  client %5.0f µs a completion  (round %d)\n", name, float64(wall.Milliseconds()), server, client, r)
		}
	}
}

func measure(admin *sql.DB, dsn string, pid, n, conc int, prepared bool, payload string) (time.Duration, float64, float64) {
	ctx := context.Background()
	must(admin.Exec(`DROP DATABASE IF EXISTS callprobe`))
	must(admin.Exec(`CREATE DATABASE callprobe`))
	db, err := sql.Open("mysql", strings.Replace(dsn, ")/", ")/callprobe", 1)+"?interpolateParams=true")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(conc)
	db.SetMaxIdleConns(conc)
	if err := stepmysql.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	must(db.Exec(`INSERT INTO steps (id, workflow_name, instance_id) VALUES (1, 'w', 'i')`))
	must(db.Exec(`INSERT INTO id_commands (enrollment_id, command_uuid, step_id, request_type) SELECT CONCAT('E', seq), 'C', 1, 'DeviceInformation' FROM seq_1_to_` + strconv.Itoa(n)))
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
		if prepared {
			if stmts[i], err = c.PrepareContext(ctx, call); err != nil {
				log.Fatal(err)
			}
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	s0, c0 := serverCPU(pid), selfCPU()
	t0 := time.Now()
	for i := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := next.Add(1); k <= int64(n); k = next.Add(1) {
				args := []any{"E" + strconv.FormatInt(k, 10), "C", int64(1), "ev-" + strconv.FormatInt(k, 10), "step.completed", []byte(payload)}
				if prepared {
					must(stmts[i].ExecContext(ctx, args...))
				} else {
					must(conns[i].ExecContext(ctx, call, args...))
				}
			}
		}()
	}
	wg.Wait()
	wall := time.Since(t0)
	var left int
	if err := admin.QueryRow(`SELECT COUNT(*) FROM callprobe.id_commands`).Scan(&left); err != nil || left != 0 {
		log.Fatalf("%d id_commands rows left (%v)", left, err)
	}
	return wall, (serverCPU(pid) - s0) * 1000 / float64(n), (selfCPU() - c0) * 1000 / float64(n)
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

// selfCPU is this process's user and system CPU in ms.
func selfCPU() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e6
}

func must(_ sql.Result, err error) {
	if err != nil {
		log.Fatal(err)
	}
}
