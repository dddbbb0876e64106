package mysql

// Helpers for statements over lists: IN-list placeholders, chunks, and
// scanning rows into slices.

import (
	"context"
	"database/sql"
	"strings"
	"time"
)

// maxInList bounds the items of one IN list: one statement stays far below
// the 65535-placeholder limit and one transaction's binlog stays small.
const maxInList = 1000

// expand writes out the list placeholders of q: each "IN (?)" becomes n
// placeholders and each "IN ((?, ?))" n pairs, in the order they appear and
// of the sizes given.
func expand(q string, sizes ...int) string {
	var b strings.Builder
	for _, n := range sizes {
		i := strings.Index(q, "IN (")
		if i < 0 {
			panic("expand: fewer lists than sizes in " + q)
		}
		b.WriteString(q[:i+3])
		q = q[i+3:]
		switch {
		case strings.HasPrefix(q, "((?, ?))"):
			b.WriteString("(" + strings.TrimSuffix(strings.Repeat("(?, ?), ", n), ", ") + ")")
			q = q[len("((?, ?))"):]
		case strings.HasPrefix(q, "(?)"):
			b.WriteString("(" + strings.TrimSuffix(strings.Repeat("?, ", n), ", ") + ")")
			q = q[len("(?)"):]
		default:
			panic("expand: unknown list form in " + q)
		}
	}
	b.WriteString(q)
	return b.String()
}

// chunks calls fn with consecutive pieces of xs of at most size items.
func chunks[T any](xs []T, size int, fn func([]T) error) error {
	for len(xs) > 0 {
		n := min(len(xs), size)
		if err := fn(xs[:n]); err != nil {
			return err
		}
		xs = xs[n:]
	}
	return nil
}

// args converts a slice to []any for a statement, after any leading args.
func args[T any](xs []T, lead ...any) []any {
	out := make([]any, 0, len(lead)+len(xs))
	out = append(out, lead...)
	for _, x := range xs {
		out = append(out, x)
	}
	return out
}

func nullString(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }

func nullTime(t time.Time) sql.NullTime { return sql.NullTime{Time: t, Valid: !t.IsZero()} }

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// queryInt64s runs a query whose rows are one integer column.
func queryInt64s(ctx context.Context, q querier, query string, args ...any) ([]int64, error) {
	return queryList(ctx, q, query, args, func(rs *sql.Rows) (int64, error) {
		var v int64
		return v, rs.Scan(&v)
	})
}

// queryStrings runs a query whose rows are one string column.
func queryStrings(ctx context.Context, q querier, query string, args ...any) ([]string, error) {
	return queryList(ctx, q, query, args, func(rs *sql.Rows) (string, error) {
		var v string
		return v, rs.Scan(&v)
	})
}

// queryList runs query and scans every row with scan.
func queryList[T any](ctx context.Context, q querier, query string, args []any, scan func(*sql.Rows) (T, error)) ([]T, error) {
	rs, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	var out []T
	for rs.Next() {
		v, err := scan(rs)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rs.Err()
}
