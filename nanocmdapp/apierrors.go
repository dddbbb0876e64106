package nanocmdapp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/micromdm/nanocmd/engine"
	storageeng "github.com/micromdm/nanocmd/engine/storage"
	"github.com/micromdm/nanocmd/http/api"
	storagecmdplan "github.com/micromdm/nanocmd/subsystem/cmdplan/storage"
	storageprof "github.com/micromdm/nanocmd/subsystem/profile/storage"
	"github.com/micromdm/nanocmd/workflow"
	"github.com/micromdm/nanolib/storage/kv"

	"github.com/stepcollect/stepcollect/internal/bodyadmit"
	"github.com/stepcollect/stepcollect/nanocmdapp/mysqlstore"
	"github.com/stepcollect/stepcollect/storage"
)

// NanoCMD's API handlers answer every error 500 (api.JSONError(w, err,
// 0)), a client's mistake too. The starter and storages they are given
// find those mistakes and note a status and message in the request's
// context; noteStatus, in front of the keyed routes, answers the
// handler's 500 with them.

type noteKey struct{}

// note is a request's mistake: its status, the answer's message, and the
// error it was found in (nil: found in the request itself).
type note struct {
	status int
	msg    string
	cause  error
}

func noteOf(ctx context.Context) *note {
	n, _ := ctx.Value(noteKey{}).(*note)
	return n
}

// refuse notes status and msg for ctx's request, found in cause.
func refuse(ctx context.Context, status int, msg string, cause error) {
	if n := noteOf(ctx); n != nil {
		*n = note{status: status, msg: msg, cause: cause}
	}
}

// refused is refuse for a mistake found before the storage or engine is
// asked: the error to return in its place.
func refused(ctx context.Context, status int, msg string) error {
	refuse(ctx, status, msg, nil)
	return errors.New(msg)
}

// noteStatus answers a handler's 500 with the status and message its
// request noted, in NanoCMD's {"error": "..."} shape.
func noteStatus(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := &note{}
		next.ServeHTTP(&notedWriter{ResponseWriter: w, note: n}, r.WithContext(context.WithValue(r.Context(), noteKey{}, n)))
	})
}

type notedWriter struct {
	http.ResponseWriter
	note     *note
	replaced bool // the handler's body is dropped
}

func (w *notedWriter) WriteHeader(code int) {
	if code == http.StatusInternalServerError && w.note.status != 0 {
		w.replaced = true
		api.JSONError(w.ResponseWriter, errors.New(w.note.msg), w.note.status)
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *notedWriter) Write(b []byte) (int, error) {
	if w.replaced {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

func (w *notedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// maxNameLen is the longest id or name the MySQL storages hold (VARCHAR(255)).
const maxNameLen = 255

// nameProblem says what makes s no id or name, or "".
func nameProblem(s string) string {
	switch {
	case s == "":
		return "empty"
	case len(s) > maxNameLen:
		return fmt.Sprintf("%.40q… is longer than %d bytes", s, maxNameLen)
	case !utf8.ValidString(s):
		return fmt.Sprintf("%.40q is not valid UTF-8", s)
	case strings.ContainsFunc(s, unicode.IsControl):
		return fmt.Sprintf("%.40q holds a control character", s)
	}
	return ""
}

// checkNames refuses the first of names that is no name, as field.
func checkNames(ctx context.Context, field string, names ...string) error {
	for _, n := range names {
		if p := nameProblem(n); p != "" {
			return refused(ctx, http.StatusBadRequest, field+": "+p)
		}
	}
	return nil
}

// idsProblem says what is wrong with a start's ids, or "". With fold,
// ids equal but for case or trailing spaces are one enrollment, as MySQL
// compares them.
func idsProblem(ids []string, fold bool) string {
	seen := make(map[string]int, len(ids))
	for i, id := range ids {
		if p := nameProblem(id); p != "" {
			return fmt.Sprintf("id: %s (id %d of %d)", p, i+1, len(ids))
		}
		k := id
		if fold {
			k = strings.ToLower(strings.TrimRight(id, " "))
		}
		if j, dup := seen[k]; dup && ids[j] == id {
			return fmt.Sprintf("id: %.40q given twice", id)
		} else if dup {
			return fmt.Sprintf("id: %.40q and %.40q are one enrollment (ids are compared without regard to case or trailing spaces)", ids[j], id)
		}
		seen[k] = i
	}
	return ""
}

// checkedStarter is the engine as NanoCMD's API handlers see it: the
// workflow and ids checked before the engine sees them, its errors noted.
type checkedStarter struct {
	e    *engine.Engine
	fold bool // -storage mysql
}

func (s checkedStarter) WorkflowRegistered(name string) bool { return s.e.WorkflowRegistered(name) }

func (s checkedStarter) StartWorkflow(ctx context.Context, name string, wfCtx []byte, ids []string, ev *workflow.Event, mdmCtx *workflow.MDMContext) (string, error) {
	if !s.e.WorkflowRegistered(name) {
		return "", refused(ctx, http.StatusNotFound, fmt.Sprintf("workflow: no such workflow %.80q", name))
	}
	if p := idsProblem(ids, s.fold); p != "" {
		return "", refused(ctx, http.StatusBadRequest, p)
	}
	instance, err := s.e.StartWorkflow(ctx, name, wfCtx, ids, ev, mdmCtx)
	if err != nil {
		noteStart(ctx, err)
	}
	return instance, err
}

// contextMistakes are what NanoCMD v0.7.1's workflows say of a context
// they cannot start with.
var contextMistakes = []string{"converting step start: ", "supplied in context", "missing cmdplan name", "validating context: ", "no commands to queue"}

// noteStart notes what a start's error says of the request.
func noteStart(ctx context.Context, err error) {
	n := noteOf(ctx)
	if n == nil {
		return
	}
	var ee *EnqueueError
	var se *storage.Error
	msg := strings.TrimPrefix(err.Error(), "starting workflow: ")
	switch {
	case n.status != 0 && n.cause != nil && errors.Is(err, n.cause):
		// a missing profile or cmdplan, as its storage noted
	case errors.Is(err, engine.ErrWorkflowAlreadyStarted):
		refuse(ctx, http.StatusConflict, "id: "+err.Error(), err)
	case errors.As(err, &ee):
		refuse(ctx, http.StatusBadGateway, ee.Error(), err)
	case errors.As(err, &se) && se.Code != storage.ENotFound:
		status := map[string]int{storage.EInvalid: http.StatusBadRequest, storage.EConflict: http.StatusConflict, storage.ETooLarge: http.StatusRequestEntityTooLarge}[se.Code]
		msg := se.Message
		if strings.Contains(msg, "`") { // the server's words name the column
			msg = "a value of the start cannot be stored: the database's columns cannot hold it"
		}
		refuse(ctx, status, bodyadmit.OneLine(msg), err)
	case errors.Is(err, workflow.ErrIncorrectContextType) || containsAny(msg, contextMistakes):
		refuse(ctx, http.StatusBadRequest, "context: "+bodyadmit.OneLine(strings.TrimPrefix(msg, "converting step start: ")), err)
	default:
		*n = note{} // a storage's note the start got past
	}
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// noteMissing notes a 404 naming the first of names not found, when err
// says one is missing (notFound) or none was but found says one is.
func noteMissing(ctx context.Context, what string, names []string, found func(string) bool, err error, notFound ...error) {
	if err != nil && !containsErr(err, notFound) {
		return
	}
	for _, n := range names {
		if !found(n) {
			refuse(ctx, http.StatusNotFound, fmt.Sprintf("%s: no %s named %.80q", what, what, n), err)
			return
		}
	}
}

func containsErr(err error, targets []error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// notedProfiles is the profile storage of the API and the workflows: names
// checked first, a missing profile noted as a 404 naming it.
type notedProfiles struct{ storageprof.Storage }

func (p notedProfiles) RetrieveProfileInfos(ctx context.Context, names []string) (map[string]storageprof.ProfileInfo, error) {
	if err := checkNames(ctx, "profile name", names...); err != nil {
		return nil, err
	}
	m, err := p.Storage.RetrieveProfileInfos(ctx, names)
	noteMissing(ctx, "profile", names, func(n string) bool { _, ok := m[n]; return ok }, err, storageprof.ErrProfileNotFound)
	return m, err
}

func (p notedProfiles) RetrieveRawProfiles(ctx context.Context, names []string) (map[string][]byte, error) {
	if err := checkNames(ctx, "profile name", names...); err != nil {
		return nil, err
	}
	m, err := p.Storage.RetrieveRawProfiles(ctx, names)
	noteMissing(ctx, "profile", names, func(n string) bool { _, ok := m[n]; return ok }, err, storageprof.ErrProfileNotFound)
	return m, err
}

func (p notedProfiles) StoreProfile(ctx context.Context, name string, info storageprof.ProfileInfo, raw []byte) error {
	if err := checkNames(ctx, "profile name", name); err != nil {
		return err
	}
	if err := checkNames(ctx, "profile PayloadIdentifier and PayloadUUID", info.Identifier, info.UUID); err != nil {
		return err
	}
	return p.Storage.StoreProfile(ctx, name, info, raw)
}

func (p notedProfiles) DeleteProfile(ctx context.Context, name string) error {
	if err := checkNames(ctx, "profile name", name); err != nil {
		return err
	}
	return p.Storage.DeleteProfile(ctx, name)
}

// notedCMDPlans is notedProfiles for command plans.
type notedCMDPlans struct{ storagecmdplan.Storage }

func (p notedCMDPlans) RetrieveCMDPlan(ctx context.Context, name string) (*storagecmdplan.CMDPlan, error) {
	if err := checkNames(ctx, "cmdplan name", name); err != nil {
		return nil, err
	}
	plan, err := p.Storage.RetrieveCMDPlan(ctx, name)
	noteMissing(ctx, "cmdplan", []string{name}, func(string) bool { return err == nil && plan != nil }, err, mysqlstore.ErrCMDPlanNotFound, kv.ErrKeyNotFound)
	return plan, err
}

func (p notedCMDPlans) StoreCMDPlan(ctx context.Context, name string, plan *storagecmdplan.CMDPlan) error {
	if err := checkNames(ctx, "cmdplan name", name); err != nil {
		return err
	}
	return p.Storage.StoreCMDPlan(ctx, name, plan)
}

func (p notedCMDPlans) DeleteCMDPlan(ctx context.Context, name string) error {
	if err := checkNames(ctx, "cmdplan name", name); err != nil {
		return err
	}
	return p.Storage.DeleteCMDPlan(ctx, name)
}

// notedEvents is the event subscription storage of the API: names checked.
type notedEvents struct {
	storageeng.EventSubscriptionStorage
}

func (s notedEvents) RetrieveEventSubscriptions(ctx context.Context, names []string) (map[string]*storageeng.EventSubscription, error) {
	if err := checkNames(ctx, "event subscription name", names...); err != nil {
		return nil, err
	}
	return s.EventSubscriptionStorage.RetrieveEventSubscriptions(ctx, names)
}

func (s notedEvents) StoreEventSubscription(ctx context.Context, name string, es *storageeng.EventSubscription) error {
	if err := checkNames(ctx, "event subscription name", name); err != nil {
		return err
	}
	return s.EventSubscriptionStorage.StoreEventSubscription(ctx, name, es)
}

func (s notedEvents) DeleteEventSubscription(ctx context.Context, name string) error {
	if err := checkNames(ctx, "event subscription name", name); err != nil {
		return err
	}
	return s.EventSubscriptionStorage.DeleteEventSubscription(ctx, name)
}

// jsonBodies are the keyed routes whose handler decodes a JSON body, and
// what into: a body it cannot decode is its 500, here a 400 naming why.
var jsonBodies = map[string]func() any{
	"/v1/cmdplan/": func() any { return new(storagecmdplan.CMDPlan) },
	"/v1/event/":   func() any { return new(storageeng.EventSubscription) },
}

// checkJSONBody decodes a PUT's body as its handler will, and refuses one
// it cannot decode with a 400.
func checkJSONBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for prefix, into := range jsonBodies {
			if r.Method != http.MethodPut || !strings.HasPrefix(r.URL.Path, prefix) {
				continue
			}
			body, err := io.ReadAll(r.Body)
			if err == nil {
				err = json.NewDecoder(bytes.NewReader(body)).Decode(into())
			}
			if errors.Is(err, io.EOF) {
				err = errors.New("empty")
			}
			if err != nil {
				api.JSONError(w, fmt.Errorf("body: %s", bodyadmit.OneLine(err.Error())), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		next.ServeHTTP(w, r)
	})
}
