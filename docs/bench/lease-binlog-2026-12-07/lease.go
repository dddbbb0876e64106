//go:build ignore

// lease measures what the worker's claim UPDATE costs the server a row,
// with the event's payload large or 1 byte, and with the binary log's row
// image FULL, NOBLOB or off (sql_log_bin=0) for the session.
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/stepcollect/stepcollect/internal/testkit"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

func main() {
	dsn := flag.String("dsn", "root@tcp(127.0.0.1:3307)/", "")
	pid := flag.Int("pid", 0, "")
	n := flag.Int("n", 20000, "rows")
	conc := flag.Int("c", 4, "claims at once")
	batch := flag.Int("batch", 64, "rows a claim")
	rounds := flag.Int("rounds", 3, "")
	which := flag.String("modes", "full/640,full/1,noblob/640,nolog/640", "")
	flag.Parse()
	admin, err := sql.Open("mysql", *dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Exec(`DROP DATABASE IF EXISTS leaseprobe`)
	for r := 1; r <= *rounds; r++ {
		for _, m := range strings.Split(*which, ",") {
			img, size, _ := strings.Cut(m, "/")
			sz, _ := strconv.Atoi(size)
			server, client, binlog := measure(admin, *dsn, *pid, *n, *conc, *batch, img, sz)
			fmt.Printf("%-12s server %5.1f µs  client %5.1f µs  binlog %6.0f bytes a row  (round %d)\n", m, server, client, binlog, r)
		}
	}
}

func measure(admin *sql.DB, dsn string, pid, n, conc, batch int, img string, size int) (float64, float64, float64) {
	ctx := context.Background()
	must(admin.Exec(`DROP DATABASE IF EXISTS leaseprobe`))
	must(admin.Exec(`CREATE DATABASE leaseprobe`))
	db, err := sql.Open("mysql", strings.Replace(dsn, ")/", ")/leaseprobe", 1)+"?interpolateParams=true")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(conc + 1)
	if err := stepmysql.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	payload := strings.Repeat("p", size)
	for lo := 1; lo <= n; lo += 500 {
		var rows []string
		for k := lo; k < lo+500 && k <= n; k++ {
			rows = append(rows, fmt.Sprintf("('ev-%d', 'step.completed', 1, 'E%d', '%s')", k, k, payload))
		}
		must(db.Exec(`INSERT INTO stepcollect_outbox (event_id, event_type, step_id, enrollment_id, payload) VALUES ` + strings.Join(rows, ",")))
	}
	conns := make([]*sql.Conn, conc)
	for i := range conns {
		c, err := db.Conn(ctx)
		if err != nil {
			log.Fatal(err)
		}
		defer c.Close()
		switch img {
		case "noblob":
			must(c.ExecContext(ctx, `SET SESSION binlog_row_image = 'NOBLOB'`))
		case "nolog":
			must(c.ExecContext(ctx, `SET SESSION sql_log_bin = 0`))
		}
		conns[i] = c
	}
	time.Sleep(time.Second)
	b0 := binlogBytes(admin)
	var next atomic.Int64
	var wg sync.WaitGroup
	s0, c0 := serverCPU(pid), selfCPU()
	for i := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				lo := next.Add(int64(batch)) - int64(batch) + 1
				if lo > int64(n) {
					return
				}
				ids := make([]string, 0, batch)
				for k := lo; k < lo+int64(batch) && k <= int64(n); k++ {
					ids = append(ids, strconv.FormatInt(k, 10))
				}
				must(conns[i].ExecContext(ctx, `UPDATE stepcollect_outbox SET attempts = attempts + 1, lease_until = NOW(6) + INTERVAL 3 SECOND WHERE id IN (`+strings.Join(ids, ",")+`)`))
			}
		}()
	}
	wg.Wait()
	time.Sleep(300 * time.Millisecond)
	return (serverCPU(pid) - s0) * 1000 / float64(n), (selfCPU() - c0) * 1000 / float64(n), float64(binlogBytes(admin)-b0) / float64(n)
}

func binlogBytes(admin *sql.DB) int64 {
	rows, err := admin.Query(`SHOW BINARY LOGS`)
	if err != nil {
		return 0
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var total int64
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		rows.Scan(ptrs...)
		switch v := vals[1].(type) {
		case []byte:
			n, _ := strconv.ParseInt(string(v), 10, 64)
			total += n
		case int64:
			total += v
		case uint64:
			total += int64(v)
		}
	}
	return total
}

// serverCPU is the server's CPU time so far, in ms.
func serverCPU(pid int) float64 {
	d, err := testkit.ProcessCPU(pid)
	if err != nil {
		log.Fatal(err)
	}
	return float64(d.Milliseconds())
}

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
