package testha

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// respConn is one connection to a redis-server (or Sentinel) speaking
// RESP2, enough for the few commands a test asks (ROLE, SENTINEL …): the
// package needs no Redis client library of its own. It redials after any
// I/O error; a server's error reply leaves the connection as it was.
type respConn struct {
	addr string

	mu sync.Mutex
	c  net.Conn
	r  *bufio.Reader
}

// ReplyError is an error reply from the server ("-ERR …", "-NOGOODSLAVE …").
type ReplyError string

func (e ReplyError) Error() string { return string(e) }

// do sends one command and returns its reply: a string (simple or bulk),
// an int64, a []any, nil (a null bulk or array), or a ReplyError.
func (rc *respConn) do(ctx context.Context, args ...string) (any, error) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.c == nil {
		d := net.Dialer{Timeout: 500 * time.Millisecond}
		c, err := d.DialContext(ctx, "tcp", rc.addr)
		if err != nil {
			return nil, err
		}
		rc.c, rc.r = c, bufio.NewReader(c)
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(2 * time.Second)
	}
	rc.c.SetDeadline(deadline)
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	v, err := func() (any, error) {
		if _, err := io.WriteString(rc.c, b.String()); err != nil {
			return nil, err
		}
		return readReply(rc.r)
	}()
	var re ReplyError
	if err != nil && !errors.As(err, &re) {
		rc.c.Close()
		rc.c, rc.r = nil, nil
	}
	return v, err
}

func (rc *respConn) close() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.c != nil {
		rc.c.Close()
		rc.c, rc.r = nil, nil
	}
}

func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("resp: empty line")
	}
	switch body := line[1:]; line[0] {
	case '+':
		return body, nil
	case '-':
		return nil, ReplyError(body)
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = readReply(r); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("resp: unexpected reply %q", line)
}

// kv reads a flat key, value, key, value … array (SENTINEL replicas and
// SENTINEL sentinels answer a list of those) into a map.
func kv(v any) map[string]string {
	xs, _ := v.([]any)
	m := map[string]string{}
	for i := 0; i+1 < len(xs); i += 2 {
		m[fmt.Sprint(xs[i])] = fmt.Sprint(xs[i+1])
	}
	return m
}
