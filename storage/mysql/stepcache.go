package mysql

import (
	"bytes"
	"container/list"
	"sync"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
)

// stepCache keeps the context of recently completed steps. The columns it
// holds (workflow, instance, name, context) never change after StoreStep,
// and step ids are never reused (AUTO_INCREMENT, persisted by MySQL 8 and
// MariaDB 10.2+), so an entry can only go stale if someone rewrites the
// table by hand: the TTL bounds even that. Contexts over 64 KiB are not
// kept.
type stepCache struct {
	mu      sync.Mutex
	max     int
	ttl     time.Duration
	order   *list.List // front: most recently used
	entries map[int64]*list.Element
}

type stepEntry struct {
	id  int64
	at  time.Time
	ctx nanostorage.StepContext
}

const maxCachedContext = 64 << 10

func newStepCache(max int, ttl time.Duration) *stepCache {
	return &stepCache{max: max, ttl: ttl, order: list.New(), entries: map[int64]*list.Element{}}
}

func (c *stepCache) get(id int64) (nanostorage.StepContext, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[id]
	if !ok {
		return nanostorage.StepContext{}, false
	}
	e := el.Value.(*stepEntry)
	if time.Since(e.at) > c.ttl {
		c.order.Remove(el)
		delete(c.entries, id)
		return nanostorage.StepContext{}, false
	}
	c.order.MoveToFront(el)
	sc := e.ctx
	sc.Context = bytes.Clone(sc.Context) // callers may keep and change theirs
	return sc, true
}

func (c *stepCache) put(id int64, sc nanostorage.StepContext) {
	if len(sc.Context) > maxCachedContext {
		return
	}
	sc.Context = bytes.Clone(sc.Context)
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[id]; ok {
		c.order.MoveToFront(el)
		return
	}
	c.entries[id] = c.order.PushFront(&stepEntry{id: id, at: time.Now(), ctx: sc})
	for c.order.Len() > c.max {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.entries, last.Value.(*stepEntry).id)
	}
}
