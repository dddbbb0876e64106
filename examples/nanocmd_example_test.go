package examples_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/micromdm/nanocmd/engine/storage"
	"github.com/rs/zerolog"

	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// NanoCMD with stepcollect's storage in place of its own MySQL storage, as
// docs/engines.md's "Using the storage from Go" shows it. The storage is what
// NanoCMD's engine.New and engine.NewWorker take; here it is driven
// through the same interface the engine uses: a step stored for two
// enrollments, one of them answering.
func Example_nanocmd() {
	ctx := context.Background()
	logger := zerolog.New(os.Stderr).With().Timestamp().Str("service", "nanocmd").Logger()

	// NanoCMD's database, or a new one: Migrate adopts NanoCMD v0.7.1's
	// schema as it is and adds stepcollect's tables.
	db, err := stepmysql.OpenDB(os.Getenv("NANOCMD_MYSQL_DSN")) // user:password@tcp(host:3306)/nanocmd
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := stepmysql.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	s, err := stepmysql.New(
		stepmysql.WithDB(db),
		stepmysql.WithLogger(logger.With().Str("component", "storage").Logger()),
	)
	if err != nil {
		log.Fatal(err)
	}

	// what NanoCMD's engine and worker take:
	//   e := engine.New(store, nanoMDM)
	//   w := engine.NewWorker(e, store, nanoMDM)
	var store storage.AllStorage = s

	step := &storage.StepEnqueuingWithConfig{StepEnqueueing: storage.StepEnqueueing{
		StepContext: storage.StepContext{WorkflowName: "io.example.inventory", InstanceID: "run-1", Name: "query"},
		IDs:         []string{"DEV-1", "DEV-2"},
		Commands:    []storage.StepCommandRaw{{CommandUUID: "U-1", RequestType: "DeviceInformation", Command: []byte("<plist/>")}},
	}}
	if err := store.StoreStep(ctx, step, time.Now()); err != nil {
		log.Fatal(err)
	}

	// DEV-1 answers U-1 (NanoMDM's webhook, through NanoCMD)
	reqType, ours, err := store.RetrieveCommandRequestType(ctx, "DEV-1", "U-1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("U-1:", reqType, ours)
	done, err := store.StoreCommandResponseAndRetrieveCompletedStep(ctx, "DEV-1", &storage.StepCommandResult{
		CommandUUID: "U-1", RequestType: reqType, Completed: true,
		ResultReport: []byte(`<?xml version="1.0" encoding="UTF-8"?><plist version="1.0"><dict><key>Status</key><string>Acknowledged</string></dict></plist>`),
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%v completed %s of %s (%s): %d result(s)\n", done.IDs, done.Name, done.WorkflowName, done.InstanceID, len(done.Commands))

	outstanding, err := store.RetrieveOutstandingWorkflowStatus(ctx, "io.example.inventory", []string{"DEV-1", "DEV-2"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("still outstanding:", outstanding)
	// Output:
	// U-1: DeviceInformation true
	// [DEV-1] completed query of io.example.inventory (run-1): 1 result(s)
	// still outstanding: [DEV-2]
}
