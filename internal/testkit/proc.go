package testkit

// stepcollect's binaries built and run as real processes, for tests that
// drive them from outside, as NanoMDM and a workflow engine would.

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Build compiles the main packages (module paths relative to the module
// root, like "cmd/api") into dir and returns their paths by name. Call it
// from TestMain.
func Build(dir string, pkgs ...string) (map[string]string, error) {
	return build(dir, []string{"-race"}, pkgs)
}

// BuildPlain is Build without the race detector, for tests that measure a
// binary's memory: the detector's shadow memory would multiply it.
func BuildPlain(dir string, pkgs ...string) (map[string]string, error) {
	return build(dir, nil, pkgs)
}

func build(dir string, flags, pkgs []string) (map[string]string, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, p := range pkgs {
		bin := filepath.Join(dir, filepath.Base(p))
		args := append(append([]string{"build"}, flags...), "-o", bin, "./"+p)
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("building %s: %v\n%s", p, err, b)
		}
		out[filepath.Base(p)] = bin
	}
	return out, nil
}

func moduleRoot() (string, error) {
	b, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	return filepath.Dir(strings.TrimSpace(string(b))), nil
}

// FreePort returns a 127.0.0.1 port free right now.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := PickPort()
	if err != nil {
		t.Fatalf("finding a free port: %v", err)
	}
	return port
}

// PickPort is FreePort outside a test (the bench's).
//
// The port comes from below the kernel's ephemeral range
// (ip_local_port_range), never from it. A port picked now is often
// listened on much later (a Galera node's IST receiver only binds when
// the node rejoins), and meanwhile any outgoing connection on the machine
// may be given an ephemeral port as its own local one: a port the kernel
// handed out for ":0" is one of those. One that did cost a CI run ("Failed
// to open IST listener … Address already in use", the node aborting).
func PickPort() (int, error) {
	lo, hi := pickRange()
	port, err := pickFree(func() int { return lo + rand.IntN(hi-lo) }, 200)
	if err != nil {
		return 0, fmt.Errorf("no free port in %d–%d: %w", lo, hi-1, err)
	}
	return port, nil
}

// pickFree returns the first of up to tries candidates that no other
// process of the tests or the bench has picked (reservePort) and that
// 127.0.0.1 can listen on now.
func pickFree(next func() int, tries int) (int, error) {
	for range tries {
		port := next()
		if !reservePort(port) {
			continue // picked by another test process, maybe not listened on yet
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue // in use: another (its reservation kept, so not tried again)
		}
		ln.Close()
		return port, nil
	}
	return 0, fmt.Errorf("%d candidates tried, every one in use", tries)
}

// reserved holds a lock file for every port this process picked, for as
// long as it lives: go test runs packages side by side, and a port one of
// them picked is free until its server starts and again while a fault test
// has that server killed, for seconds. Listening alone would hand it to a
// second process (CI saw a recovery test's port taken so). A process that
// ends gives its ports back (flock).
var reserved = struct {
	sync.Mutex
	files map[int]*os.File
}{files: map[int]*os.File{}}

// reservePort reports whether port is now this process's: false if this
// or another process holds it.
func reservePort(port int) bool {
	reserved.Lock()
	defer reserved.Unlock()
	if reserved.files[port] != nil {
		return false
	}
	dir := filepath.Join(os.TempDir(), "stepcollect-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return true // no reservations here: the listen check alone decides
	}
	f, err := tryLock(filepath.Join(dir, strconv.Itoa(port)))
	if err != nil {
		return true // no reservations here: the listen check alone decides
	}
	if f == nil {
		return false
	}
	reserved.files[port] = f
	return true
}

// pickRange is where PickPort draws from: [10000, the first ephemeral
// port), or 10000–32767 where the range cannot be read or starts too low
// to leave room below it.
func pickRange() (lo, hi int) {
	lo, hi = 10000, 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lo, hi
	}
	if f := strings.Fields(string(b)); len(f) == 2 {
		if first, err := strconv.Atoi(f[0]); err == nil && first > lo+1000 {
			hi = first
		}
	}
	return lo, hi
}

// FreeAddr returns a 127.0.0.1 address with a port free right now.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t)))
}

// RequireBinary skips t (fails it under CI=true) unless every binary is on
// PATH.
func RequireBinary(t testing.TB, bins ...string) {
	t.Helper()
	for _, b := range bins {
		if _, err := exec.LookPath(b); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is required under CI (CI=true): %v", b, err)
			}
			t.Skipf("%s not installed: %v", b, err)
		}
	}
}

// Dial reports whether addr accepts a TCP connection now (nil if it does).
func Dial(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err == nil {
		c.Close()
	}
	return err
}

// Proc is a running binary.
type Proc struct {
	Cmd  *exec.Cmd
	logs *LogBuffer
}

// StartProc runs bin with args and extra environment (NAME=value), killing it
// when t ends if it is still running.
func StartProc(t testing.TB, bin string, env []string, args ...string) *Proc {
	t.Helper()
	p, err := StartProcess(bin, env, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.Cmd.ProcessState == nil {
			p.Cmd.Process.Kill()
			p.Cmd.Wait()
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", filepath.Base(bin), p.Logs())
		}
	})
	return p
}

// StartProcess is StartProc outside a test (the bench's): the caller
// stops the process (Kill, Stop).
func StartProcess(bin string, env []string, args ...string) (*Proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	logs := &LogBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &Proc{Cmd: cmd, logs: logs}, nil
}

// PID is the process's id.
func (p *Proc) PID() int { return p.Cmd.Process.Pid }

// PeakRSS is the most resident memory the process has used so far, in
// bytes (VmHWM of /proc/<pid>/status; Linux only), since it started or
// since the last ResetPeakRSS.
func (p *Proc) PeakRSS() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID()))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("VmHWM: %q: %v", v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no VmHWM", p.PID())
}

// ResetPeakRSS starts PeakRSS again from the memory resident now (writes 5
// to /proc/<pid>/clear_refs; Linux 4.0 and later).
func (p *Proc) ResetPeakRSS() error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", p.PID()), []byte("5"), 0)
}

// exited reports whether the process has ended, reaped or not: nothing
// waits on it until the test's cleanup, so until then an ended process is
// a zombie (state Z in /proc/<pid>/stat), or gone.
func (p *Proc) exited() bool {
	if p.Cmd.ProcessState != nil {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID()))
	if err != nil {
		return os.IsNotExist(err)
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}

// Describe says whether the process still runs, for a test's failure
// report: "running (pid N)", or how it ended ("exited (pid N): signal:
// killed"), reaping it if it had ended unreaped. A request that got no
// answer is the server's doing if it runs, and its death's if not.
func (p *Proc) Describe() string {
	if !p.exited() {
		return fmt.Sprintf("running (pid %d)", p.PID())
	}
	if p.Cmd.ProcessState == nil {
		p.Cmd.Wait() // a zombie: its status is there to read
	}
	return fmt.Sprintf("exited (pid %d): %v", p.PID(), p.Cmd.ProcessState)
}

// Logs is everything the process wrote so far.
func (p *Proc) Logs() string { return p.logs.String() }

// Stop sends SIGTERM and waits, returning the exit error.
func (p *Proc) Stop() error {
	p.Cmd.Process.Signal(syscall.SIGTERM)
	return p.Cmd.Wait()
}

// Kill sends SIGKILL and waits.
func (p *Proc) Kill() {
	p.Cmd.Process.Signal(syscall.SIGKILL)
	p.Cmd.Wait()
}

// AwaitHTTP waits until GET url answers 200, or fails t after within (or
// as soon as p exits) with the last answer and p's output.
func AwaitHTTP(t testing.TB, p *Proc, url string, within time.Duration) {
	t.Helper()
	var last string
	exited := false
	_, ok := Watch(time.Now().Add(within), func() bool {
		if p.exited() {
			exited = true
			return true // no use waiting for a process that is gone
		}
		resp, err := http.Get(url)
		if err != nil {
			last = err.Error()
			return false
		}
		resp.Body.Close()
		last = resp.Status
		return resp.StatusCode == http.StatusOK
	})
	if exited && p.Cmd.ProcessState == nil {
		// reaped, so that its output is all there: os/exec copies it
		// from a pipe, and Wait is what waits for the copy to end (a
		// zombie's last words may still be in the pipe)
		p.Cmd.Wait()
	}
	if !ok || exited {
		t.Fatalf("%s did not answer 200 within %v (last: %s; exited: %v):\n%s", url, within, last, exited, p.Logs())
	}
}

// StartService starts bin (the api or the worker) with env, listening on a
// free address given to it as -<addrFlag>, and waits until its /readyz
// answers 200. It returns the process and its base URL.
func StartService(t testing.TB, bin string, env []string, addrFlag string, args ...string) (*Proc, string) {
	t.Helper()
	addr := FreeAddr(t)
	p := StartProc(t, bin, env, append([]string{"-" + addrFlag, addr}, args...)...)
	AwaitHTTP(t, p, "http://"+addr+"/readyz", 30*time.Second)
	return p, "http://" + addr
}

// ServiceEnv is the environment that points a binary at dsn and redisURL,
// with extra (NAME=value) after it (a later value of a name wins). Each
// service's pool is ServicePoolSize: the tests share one server's
// max_connections (151 by default), two packages at a time, and a stack of
// two services at the default 64 each beside a test's own pool reached it.
// It has no spare capacity, so that two appends to it never share an array.
func ServiceEnv(dsn, redisURL string, extra ...string) []string {
	return slices.Clip(append([]string{"STEPCOLLECT_MYSQL_DSN=" + dsn, "STEPCOLLECT_REDIS_URL=" + redisURL,
		fmt.Sprintf("STEPCOLLECT_MYSQL_MAX_CONNS=%d", ServicePoolSize)}, extra...))
}

// ServicePoolSize is the MySQL pool of every service a test starts: a real
// pool (results commit concurrently), not the production default.
const ServicePoolSize = 32

// LogBuffer keeps what a process writes, safe to read while it writes.
type LogBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *LogBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *LogBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// EnvInt is the positive integer in the environment variable name, or def:
// how tests are sized from outside (STEPCOLLECT_PACE_N, say).
func EnvInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// services are the api and worker binaries MainServices built, for
// StartStack.
var services map[string]string

// MainServices is Main for a package whose tests run a Stack: it builds
// cmd/api and cmd/worker (or takes them from binDirEnv's directory), and
// StartStack uses them.
func MainServices(m *testing.M, binDirEnv string, race bool) {
	Main(m, binDirEnv, race, func(b map[string]string) { services = b }, "cmd/api", "cmd/worker")
}

// Services is the api and the worker MainServices built ("api",
// "worker"), for a test that starts them itself.
func Services() map[string]string { return services }

// Main is a test package's TestMain for tests that run the binaries: it
// builds pkgs (like "cmd/api") into a temporary directory, with the race
// detector or without (plain: for tests that measure timing or memory),
// hands their paths by name to use, runs the tests, removes the directory
// and exits. When the environment variable binDirEnv names a directory,
// the binaries there are used instead, so that a test can be run against
// another build (an older commit's, say).
func Main(m *testing.M, binDirEnv string, race bool, use func(bins map[string]string), pkgs ...string) {
	if dir := os.Getenv(binDirEnv); binDirEnv != "" && dir != "" {
		bins := map[string]string{}
		for _, p := range pkgs {
			bins[filepath.Base(p)] = filepath.Join(dir, filepath.Base(p))
		}
		use(bins)
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "stepcollect-bins")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	build := BuildPlain
	if race {
		build = Build
	}
	bins, err := build(dir, pkgs...)
	if err != nil {
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	use(bins)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// BadFlag is a command line a binary must refuse, and what its one line of
// complaint must contain.
type BadFlag struct {
	Args []string
	Env  string // NAME=value, if any
	Want string
	Hide []string // secrets the complaint must not show
}

// CheckRefuses runs bin once per case and fails t unless each exits with an
// error and one line containing its Want.
func CheckRefuses(t testing.TB, bin string, cases []BadFlag) {
	t.Helper()
	for _, tc := range cases {
		cmd := exec.Command(bin, tc.Args...)
		cmd.Env = os.Environ()
		if tc.Env != "" {
			cmd.Env = append(cmd.Env, tc.Env)
		}
		out, err := cmd.CombinedOutput()
		line := strings.TrimSpace(string(out))
		if err == nil {
			t.Errorf("%v %s: started (%q), want it refused", tc.Args, tc.Env, line)
			continue
		}
		if strings.Contains(line, "\n") || !strings.Contains(line, tc.Want) {
			t.Errorf("%v %s: %v %q, want one line containing %q", tc.Args, tc.Env, err, line, tc.Want)
		}
		for _, secret := range tc.Hide {
			if strings.Contains(line, secret) {
				t.Errorf("%v %s: %q shows the secret %q", tc.Args, tc.Env, line, secret)
			}
		}
	}
}

// ProcessCPU is process pid's CPU time so far (user and system), from
// /proc/<pid>/stat: any process of this machine's, a server's too.
func ProcessCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// the fields after the parenthesised command name: utime and stime are
	// the 12th and 13th, in clock ticks of 10 ms
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the command, want 13 or more", pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := cmp.Or(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}
