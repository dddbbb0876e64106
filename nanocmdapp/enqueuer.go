package nanocmdapp

import (
	"context"

	"github.com/micromdm/nanocmd/mdm/foss"
)

// fossChunk is how many ids NanoCMD v0.7.1's foss enqueuer puts in one
// request (its defaultMaxIDs).
const fossChunk = 30

// chunkedEnqueuer hands NanoCMD's foss enqueuer at most one request's worth
// of ids at a time. v0.7.1's Enqueue reads every chunk's body from one
// bytes.Buffer, which the first request drains: every request after the
// first 30 ids went out with an empty body, and those devices never got
// the command. Called a chunk at a time, each request has its own buffer.
type chunkedEnqueuer struct {
	*foss.FossMDM
	max int
}

func (c chunkedEnqueuer) Enqueue(ctx context.Context, ids []string, rawCommand []byte) error {
	if len(ids) <= c.max || c.max <= 1 {
		return c.FossMDM.Enqueue(ctx, ids, rawCommand)
	}
	for i := 0; i < len(ids); i += c.max {
		if err := c.FossMDM.Enqueue(ctx, ids[i:min(i+c.max, len(ids))], rawCommand); err != nil {
			return err
		}
	}
	return nil
}
