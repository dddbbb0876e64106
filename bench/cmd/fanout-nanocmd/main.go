// Command fanout-nanocmd measures NanoCMD's own MySQL storage. Built from
// go.mod it is NanoCMD v0.7.1; built with -modfile=go.v070.mod, v0.7.0.
package main

import (
	"database/sql"
	"runtime/debug"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
	nanomysql "github.com/micromdm/nanocmd/engine/storage/mysql"

	"github.com/stepcollect/stepcollect/bench/internal/fanout"
)

func main() {
	label := "nanocmd"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/micromdm/nanocmd" {
				label += " " + d.Version
			}
		}
	}
	fanout.Main(fanout.Flags(label), func(db *sql.DB) (nanostorage.Storage, error) {
		return nanomysql.New(nanomysql.WithDB(db))
	})
}
