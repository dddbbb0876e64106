package main_test

import (
	"testing"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

var bins map[string]string

func TestMain(m *testing.M) {
	// without the race detector: the end-to-end tests run hundreds of
	// simulated devices against one binary on a shared 2-CPU machine
	testkit.Main(m, "STEPCOLLECT_NANOHUB_BIN_DIR", false, func(b map[string]string) { bins = b }, "cmd/nanohub")
}
