// Command fanout-stepcollect measures stepcollect's storage with inline
// collection, as a NanoCMD deployment would use it.
package main

import (
	"database/sql"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"

	"github.com/stepcollect/stepcollect/bench/internal/fanout"
	"github.com/stepcollect/stepcollect/storage/mysql"
)

func main() {
	fanout.Main(fanout.Flags("stepcollect"), func(db *sql.DB) (nanostorage.Storage, error) {
		return mysql.New(mysql.WithDB(db))
	})
}
