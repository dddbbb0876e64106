package httpapi

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// takes refuses, before h runs, a query string with a parameter the
// endpoint does not take, or with one given more than once: h reads each
// with Query().Get, which would read the first of two and ignore a
// misspelt one, and on a cancel a misspelt filter (workflow=…) cancels
// everything the filter was meant to narrow. The query itself is
// well-formed by then (auth checked it). The message names the parameter
// and what the endpoint takes.
func takes(h http.HandlerFunc, names ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		keys := make([]string, 0, len(q))
		for k := range q {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		endpoint := r.Method + " " + r.Pattern[strings.IndexByte(r.Pattern, ' ')+1:]
		for _, k := range keys {
			switch {
			case !slices.Contains(names, k):
				writeError(w, r, http.StatusBadRequest, fmt.Sprintf("%s: not a parameter of %s (it takes %s)", oneLine(k), endpoint, list(names)))
				return
			case len(q[k]) > 1:
				writeError(w, r, http.StatusBadRequest, fmt.Sprintf("%s: given %d times; give it once", k, len(q[k])))
				return
			}
		}
		h(w, r)
	}
}

// list is names as prose: "a", "a and b", "a, b and c".
func list(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}
