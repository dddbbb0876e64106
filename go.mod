module github.com/stepcollect/stepcollect

go 1.26.0

require (
	github.com/alexedwards/flow v0.0.0-20220806114457-cf11be9e0e03
	github.com/cespare/xxhash v1.1.0
	github.com/chromedp/cdproto v0.160.1
	github.com/chromedp/chromedp v0.23.1
	github.com/go-sql-driver/mysql v1.9.3
	github.com/hibiken/asynq v0.26.0
	github.com/jessepeterson/kmfddm v0.8.3
	github.com/jessepeterson/mdmcommands v0.0.0-20251210055310-75943edf7c59
	github.com/mattn/go-isatty v0.0.20
	github.com/micromdm/nanocmd v0.7.1
	github.com/micromdm/nanohub v0.2.0
	github.com/micromdm/nanolib v0.5.2
	github.com/micromdm/nanomdm v0.9.0
	github.com/micromdm/plist v0.4.0
	github.com/pressly/goose/v3 v3.26.0
	github.com/prometheus/client_golang v1.23.2
	github.com/prometheus/client_model v0.6.3
	github.com/prometheus/common v0.66.1
	github.com/redis/go-redis/v9 v9.14.1
	github.com/rs/zerolog v1.34.0
	github.com/smallstep/pkcs7 v0.2.3
	golang.org/x/sync v0.21.0
	gopkg.in/yaml.v3 v3.0.1
)

require (
	filippo.io/edwards25519 v1.1.0 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dgryski/go-rendezvous v0.0.0-20200823014737-9f7001d12a5f // indirect
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
	github.com/google/btree v1.1.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/kylelemons/godebug v1.1.0 // indirect
	github.com/lib/pq v1.10.9 // indirect
	github.com/mattn/go-colorable v0.1.13 // indirect
	github.com/mfridman/interpolate v0.0.2 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/peterbourgon/diskv/v3 v3.0.1 // indirect
	github.com/prometheus/procfs v0.21.0 // indirect
	github.com/robfig/cron/v3 v3.0.1 // indirect
	github.com/sethvargo/go-retry v0.3.0 // indirect
	github.com/spf13/cast v1.10.0 // indirect
	github.com/valyala/fastjson v1.6.4 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	go.yaml.in/yaml/v2 v2.4.5 // indirect
	golang.org/x/net v0.43.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.28.0 // indirect
	golang.org/x/time v0.14.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

// NanoCMD v0.7.1 requires plist v0.4.0, which the module proxy this project
// builds from does not serve. cmd/nanocmd (NanoCMD's engine and workflows)
// decodes results with v0.2.2, as the bench's build of NanoCMD v0.7.1 does;
// stepcollect's own decoder (internal/mdmplist) does not use plist, and its
// tests compare it with v0.2.2's Unmarshal, the same as v0.4.0's.
replace github.com/micromdm/plist => github.com/micromdm/plist v0.2.2

tool github.com/micromdm/nanomdm/cmd/nanomdm
