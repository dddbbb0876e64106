package mdmsim

import (
	"fmt"
	"sync/atomic"
)

// counters are a fleet's (or a lone device's) running totals.
type counters struct {
	enrolled, polls, commands, acknowledged, errors, notNow, failures atomic.Int64
}

func (c *counters) answered(status string) {
	c.commands.Add(1)
	switch status {
	case "Acknowledged":
		c.acknowledged.Add(1)
	case "Error":
		c.errors.Add(1)
	case "NotNow":
		c.notNow.Add(1)
	}
}

// Progress is what a fleet did so far.
type Progress struct {
	Enrolled     int64 // enrollments (re-authentications count again)
	Polls        int64 // Idle reports
	Commands     int64 // commands answered, NotNow included
	Acknowledged int64
	Errors       int64
	NotNow       int64
	Failures     int64 // requests the server did not answer 200
}

func (p Progress) String() string {
	return fmt.Sprintf("%d enrolled, %d polls, %d commands answered (%d Acknowledged, %d Error, %d NotNow), %d failed requests",
		p.Enrolled, p.Polls, p.Commands, p.Acknowledged, p.Errors, p.NotNow, p.Failures)
}
