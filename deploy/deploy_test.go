package deploy

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/internal/pgtest"
)

// walcastBin is the walcast binary, built in TestMain by the Dockerfile's own
// build command, so the flags checked below are the image's.
var walcastBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "walcast-deploy-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	walcastBin = filepath.Join(dir, "walcast")
	if err := buildLikeDockerfile(walcastBin); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := pgtest.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// --- the CLI -------------------------------------------------------------------

var (
	helpMu    sync.Mutex
	helpCache = map[string]map[string]bool{}
)

var flagLine = regexp.MustCompile(`(?m)^\s+(?:-[a-zA-Z], )?--([a-z0-9][a-z0-9-]*)`)

// cliFlags returns the flags of `walcast <command...>` as its --help lists
// them. It fails the test when the command does not exist.
func cliFlags(t *testing.T, command ...string) map[string]bool {
	t.Helper()
	key := strings.Join(command, " ")
	helpMu.Lock()
	defer helpMu.Unlock()
	if f, ok := helpCache[key]; ok {
		return f
	}
	out, err := exec.Command(walcastBin, append(command, "--help")...).CombinedOutput()
	if err != nil {
		t.Fatalf("walcast %s --help: %v\n%s", key, err, out)
	}
	// An unknown subcommand makes cobra print the parent's help: make sure
	// the usage line names the command itself.
	if !strings.Contains(string(out), "walcast "+key+" [flags]") {
		t.Fatalf("walcast has no command %q:\n%s", key, out)
	}
	flags := map[string]bool{}
	for _, m := range flagLine.FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	helpCache[key] = flags
	return flags
}

// flagOfEnv is the flag an environment variable sets: WALCAST_FOO_BAR sets
// --foo-bar (the rule of cmd/walcast's applyEnv).
func flagOfEnv(name string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(name, "WALCAST_")), "_", "-")
}

// checkInvocation checks that args (a walcast command line without the
// binary) names an existing command and that every --flag in it and every
// WALCAST_* variable in env is a flag of that command. It returns the
// command and the settings (flag → value) made by env and args.
func checkInvocation(t *testing.T, where string, args []string, env map[string]string) (string, map[string]string) {
	t.Helper()
	if len(args) == 0 {
		t.Fatalf("%s: no walcast command", where)
	}
	command := []string{args[0]}
	rest := args[1:]
	if args[0] == "slot" && len(args) > 1 {
		command, rest = args[:2], args[2:]
	}
	flags := cliFlags(t, command...)
	set := map[string]string{}
	for name, val := range env {
		if !strings.HasPrefix(name, "WALCAST_") {
			continue
		}
		if !flags[flagOfEnv(name)] {
			t.Errorf("%s: %s sets --%s, which `walcast %s` does not have", where, name, flagOfEnv(name), strings.Join(command, " "))
		}
		set[flagOfEnv(name)] = val
	}
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if !strings.HasPrefix(a, "--") {
			t.Errorf("%s: unexpected argument %q to `walcast %s`", where, a, strings.Join(command, " "))
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !flags[name] {
			t.Errorf("%s: `walcast %s` has no flag --%s", where, strings.Join(command, " "), name)
		}
		if !hasVal && i+1 < len(rest) && !strings.HasPrefix(rest[i+1], "--") {
			val = rest[i+1]
			i++
		}
		set[name] = val
	}
	return strings.Join(command, " "), set
}

// --- Dockerfile -----------------------------------------------------------------

type instruction struct {
	cmd  string // upper case: FROM, RUN, ...
	args string
}

// parseDockerfile returns the instructions of a Dockerfile, continuation
// lines joined and comments dropped.
func parseDockerfile(t testing.TB, path string) [][]instruction {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var stages [][]instruction
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		cmd, args, _ := strings.Cut(line, " ")
		in := instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			stages = append(stages, nil)
		}
		if len(stages) == 0 {
			t.Fatalf("%s: %s before FROM", path, in.cmd)
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], in)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasSuffix(line, `\`) {
			cur.WriteString(strings.TrimSuffix(line, `\`) + " ")
			continue
		}
		cur.WriteString(line)
		flush()
	}
	flush()
	return stages
}

var goBuildRun = regexp.MustCompile(`go build .*\./cmd/walcast`)

// buildLikeDockerfile runs the build stage's `go build` command (with its
// environment assignments) from the repository root, writing to out.
func buildLikeDockerfile(out string) error {
	var cmdline string
	for _, stage := range parseDockerfile(panicTB{}, "Dockerfile") {
		for _, in := range stage {
			if in.cmd == "RUN" && goBuildRun.MatchString(in.args) {
				cmdline = in.args
			}
		}
	}
	if cmdline == "" {
		return errors.New("Dockerfile: no RUN ... go build ... ./cmd/walcast")
	}
	fields := strings.Fields(cmdline)
	var env []string
	for len(fields) > 0 && strings.Contains(fields[0], "=") && !strings.HasPrefix(fields[0], "-") {
		env = append(env, fields[0])
		fields = fields[1:]
	}
	// Re-split with the quoted -ldflags kept whole.
	args, err := shellWords(strings.Join(fields, " "))
	if err != nil {
		return fmt.Errorf("Dockerfile build command: %w", err)
	}
	for i, a := range args {
		args[i] = strings.ReplaceAll(a, "${VERSION}", "deploy-test")
		if i > 0 && args[i-1] == "-o" {
			args[i] = out
		}
	}
	if args[0] != "go" || !slices.Contains(args, out) {
		return fmt.Errorf("Dockerfile build command %q: want go build ... -o PATH ./cmd/walcast", cmdline)
	}
	cmd := exec.Command("go", args[1:]...)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v\n%s", cmdline, err, b)
	}
	return nil
}

// shellWords splits s like a shell would for simple words and double-quoted
// strings (all the Dockerfile's build command uses).
func shellWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inQuote, inWord := false, false
	for _, r := range s {
		switch {
		case r == '"':
			inQuote, inWord = !inQuote, true
		case r == ' ' && !inQuote:
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inQuote {
		return nil, errors.New("unterminated quote")
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// panicTB lets parseDockerfile run in TestMain, before there is a *testing.T.
type panicTB struct{ testing.TB }

func (panicTB) Helper()                   {}
func (panicTB) Fatal(args ...any)         { panic(fmt.Sprint(args...)) }
func (panicTB) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }

func TestDockerfile(t *testing.T) {
	stages := parseDockerfile(t, "Dockerfile")
	if len(stages) < 2 {
		t.Fatalf("want a multi-stage build, got %d stage(s)", len(stages))
	}
	builder := stages[0][0].args
	goMod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(goMod)
	if goVersion == nil || !strings.HasPrefix(builder, "golang:"+string(goVersion[1])) {
		t.Errorf("builder image %q does not match go.mod's go %s", builder, goVersion[1])
	}
	var build instruction
	for _, in := range stages[0] {
		if in.cmd == "RUN" && goBuildRun.MatchString(in.args) {
			build = in
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X main.version="} {
		if !strings.Contains(build.args, want) {
			t.Errorf("build command %q lacks %s", build.args, want)
		}
	}
	// The binary that command built is static: no program interpreter and
	// no shared libraries, so it runs on distroless/static.
	f, err := elf.Open(walcastBin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the image's binary is dynamically linked (has PT_INTERP)")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("the image's binary needs shared libraries %v", libs)
	}

	final := stages[len(stages)-1]
	got := map[string]string{}
	var env []string
	for _, in := range final {
		got[in.cmd] = in.args
		if in.cmd == "ENV" {
			env = append(env, strings.Fields(in.args)...)
		}
	}
	if user := got["USER"]; user == "" || user == "root" || strings.HasPrefix(user, "0") || strings.HasPrefix(user, "root:") {
		t.Errorf("final stage runs as %q; want a non-root USER", user)
	}
	if !strings.Contains(got["COPY"], "--from=") {
		t.Errorf("final stage does not copy the binary from the build stage: COPY %s", got["COPY"])
	}
	var entry []string
	if err := yaml.Unmarshal([]byte(got["ENTRYPOINT"]), &entry); err != nil || len(entry) != 1 || filepath.Base(entry[0]) != "walcast" {
		t.Errorf(`ENTRYPOINT %s: want the exec form ["…/walcast"] (%v)`, got["ENTRYPOINT"], err)
	}
	hc := got["HEALTHCHECK"]
	_, cmdJSON, ok := strings.Cut(hc, "CMD ")
	var hcArgs []string
	if !ok || yaml.Unmarshal([]byte(cmdJSON), &hcArgs) != nil || len(hcArgs) < 2 || hcArgs[0] != entry[0] {
		t.Fatalf("HEALTHCHECK %q: want CMD [%q, \"healthcheck\", ...] (there is no shell in the final image)", hc, entry[0])
	}
	envMap := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		envMap[k] = v
	}
	// The health check and both long-running commands accept the image's
	// environment, and the health check reaches the port they listen on.
	_, hcSet := checkInvocation(t, "Dockerfile HEALTHCHECK", hcArgs[1:], nil)
	for _, cmd := range []string{"run", "sync"} {
		checkInvocation(t, "Dockerfile ENV for "+cmd, []string{cmd}, envMap)
	}
	if hcSet["url"] == "" && hcSet["path"] != "" && hcSet["path"] != "/healthz" {
		t.Errorf("HEALTHCHECK checks %s, want /healthz", hcSet["path"])
	}
	if envMap["WALCAST_HTTP_LISTEN"] == "" || strings.HasPrefix(envMap["WALCAST_HTTP_LISTEN"], "127.") {
		t.Errorf("WALCAST_HTTP_LISTEN=%q: /metrics and the probes must be reachable from outside the container", envMap["WALCAST_HTTP_LISTEN"])
	}
	if _, port, _ := strings.Cut(envMap["WALCAST_HTTP_LISTEN"], ":"); !strings.Contains(got["EXPOSE"], port) {
		t.Errorf("EXPOSE %s lacks the HTTP port %s", got["EXPOSE"], port)
	}
	if _, err := os.Stat("Dockerfile.dockerignore"); err != nil {
		t.Error(err)
	}
}

// --- compose --------------------------------------------------------------------

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       *composeBuild     `yaml:"build"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	DependsOn   map[string]any    `yaml:"depends_on"`
	Profiles    []string          `yaml:"profiles"`
}

type composeBuild struct {
	Context    string `yaml:"context"`
	Dockerfile string `yaml:"dockerfile"`
}

func loadCompose(t *testing.T) composeFile { return loadComposeFile(t, "compose.yaml") }

func loadComposeFile(t *testing.T, path string) composeFile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	// x-* extension fields hold YAML anchors only.
	var raw map[string]any
	if err := yaml.Unmarshal(b, &raw); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for k := range raw {
		if k != "services" && k != "volumes" && !strings.HasPrefix(k, "x-") {
			t.Errorf("%s: unexpected top-level key %q", path, k)
		}
	}
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

func isWalcast(s composeService) bool {
	return strings.HasPrefix(s.Image, "walcast") || s.Build != nil
}

func TestComposeFile(t *testing.T) {
	c := loadCompose(t)
	var runs []string
	runSlots := map[string]bool{}
	hostPorts := map[string]string{}
	byCommand := map[string]int{}
	for name, s := range c.Services {
		where := "compose.yaml service " + name
		for dep := range s.DependsOn {
			if _, ok := c.Services[dep]; !ok {
				t.Errorf("%s depends on unknown service %s", where, dep)
			}
		}
		for _, p := range s.Ports {
			parts := strings.Split(p, ":")
			host := strings.Join(parts[:len(parts)-1], ":")
			if other, dup := hostPorts[host]; dup && len(s.Profiles) == 0 {
				t.Errorf("%s and %s both publish %s", where, other, host)
			}
			hostPorts[host] = name
		}
		for _, v := range s.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if strings.HasPrefix(src, ".") {
				if _, err := os.Stat(src); err != nil {
					t.Errorf("%s mounts %s: %v", where, src, err)
				}
			} else if _, ok := c.Volumes[src]; !ok {
				t.Errorf("%s mounts undeclared volume %s", where, src)
			}
		}
		if !isWalcast(s) {
			for k := range s.Environment {
				if strings.HasPrefix(k, "WALCAST_") {
					t.Errorf("%s is not walcast but sets %s", where, k)
				}
			}
			continue
		}
		if s.Build != nil {
			if _, err := os.Stat(filepath.Join(s.Build.Context, s.Build.Dockerfile)); err != nil || filepath.Clean(filepath.Join(s.Build.Context, s.Build.Dockerfile)) != filepath.Clean("../deploy/Dockerfile") {
				t.Errorf("%s builds %s in %s: want deploy/Dockerfile from the repository root (%v)", where, s.Build.Dockerfile, s.Build.Context, err)
			}
		}
		command, set := checkInvocation(t, where, s.Command, s.Environment)
		byCommand[command]++
		switch command {
		case "run":
			runs = append(runs, name)
			runSlots[set["slot"]] = true
			requireSet(t, where, set, "database-url", "publication", "nats-url", "http-listen")
		case "sync":
			requireSet(t, where, set, "nats-url", "journal-url", "cursor-secret", "jwt-secret", "listen", "http-listen")
		}
		if (command == "run" || command == "sync") && strings.HasPrefix(set["http-listen"], "127.") {
			t.Errorf("%s: --http-listen %s is unreachable from outside the container", where, set["http-listen"])
		}
	}
	if len(runs) != 2 || len(runSlots) != 1 {
		t.Errorf("want two `walcast run` services on one slot (standby takeover), got %v on slots %v", runs, runSlots)
	}
	if byCommand["sync"] != 1 {
		t.Errorf("want one `walcast sync` service, got %d", byCommand["sync"])
	}

	pg, ok := c.Services["postgres"]
	if !ok {
		t.Fatal("no postgres service")
	}
	if !strings.HasPrefix(pg.Image, "postgres:15") {
		t.Errorf("postgres image %s, want postgres:15", pg.Image)
	}
	if !slices.Contains(pg.Command, "wal_level=logical") {
		t.Errorf("postgres command %v does not set wal_level=logical", pg.Command)
	}
	mounted := map[string]string{}
	for _, v := range pg.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 {
			mounted[parts[0]] = parts[1]
		}
	}
	if !strings.HasPrefix(mounted["./compose/initdb.sh"], "/docker-entrypoint-initdb.d/") {
		t.Errorf("the init script is not mounted into /docker-entrypoint-initdb.d: %v", pg.Volumes)
	}
	if sql := pg.Environment["SETUP_SQL"]; mounted["./postgres/setup.sql"] != "/walcast/setup.sql" && mounted["./postgres/setup.sql"] != sql {
		t.Errorf("setup.sql is not mounted where initdb.sh reads it: %v", pg.Volumes)
	}
}

func requireSet(t *testing.T, where string, set map[string]string, flags ...string) {
	t.Helper()
	for _, f := range flags {
		if set[f] == "" {
			t.Errorf("%s does not set --%s", where, f)
		}
	}
}

// --- Kubernetes -----------------------------------------------------------------

type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name      string            `yaml:"name"`
		Namespace string            `yaml:"namespace"`
		Labels    map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Spec       yaml.Node         `yaml:"spec"`
	Data       map[string]string `yaml:"data"`
	StringData map[string]string `yaml:"stringData"`
	Type       string            `yaml:"type"`
}

type deploymentSpec struct {
	Replicas int `yaml:"replicas"`
	Selector struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"selector"`
	Template struct {
		Metadata struct {
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Spec struct {
			SecurityContext struct {
				RunAsNonRoot bool `yaml:"runAsNonRoot"`
				RunAsUser    int  `yaml:"runAsUser"`
			} `yaml:"securityContext"`
			Containers []container `yaml:"containers"`
			Volumes    []struct {
				Name     string `yaml:"name"`
				EmptyDir *struct {
					SizeLimit string `yaml:"sizeLimit"`
				} `yaml:"emptyDir"`
			} `yaml:"volumes"`
		} `yaml:"spec"`
	} `yaml:"template"`
}

type container struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Env   []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name     string `yaml:"name"`
				Key      string `yaml:"key"`
				Optional bool   `yaml:"optional"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	LivenessProbe  *probe        `yaml:"livenessProbe"`
	ReadinessProbe *probe        `yaml:"readinessProbe"`
	StartupProbe   *probe        `yaml:"startupProbe"`
	VolumeMounts   []volumeMount `yaml:"volumeMounts"`
}

type volumeMount struct {
	Name      string `yaml:"name"`
	MountPath string `yaml:"mountPath"`
}

type probe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"`
	} `yaml:"httpGet"`
}

type selectorSpec struct {
	Selector struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"selector"`
}

type serviceSpec struct {
	Selector map[string]string `yaml:"selector"`
	Ports    []struct {
		Name       string `yaml:"name"`
		Port       int    `yaml:"port"`
		TargetPort any    `yaml:"targetPort"`
	} `yaml:"ports"`
}

func loadK8s(t *testing.T) []k8sObject { return loadK8sGlob(t, "kubernetes/*.yaml") }

func loadK8sGlob(t *testing.T, glob string) []k8sObject {
	t.Helper()
	files, err := filepath.Glob(glob)
	if err != nil || len(files) == 0 {
		t.Fatalf("no %s: %v", glob, err)
	}
	var objs []k8sObject
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var o k8sObject
			err := dec.Decode(&o)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
				t.Fatalf("%s: a document without apiVersion, kind or metadata.name", f)
			}
			objs = append(objs, o)
		}
	}
	return objs
}

func decodeSpec(t *testing.T, o k8sObject, v any) {
	t.Helper()
	if err := o.Spec.Decode(v); err != nil {
		t.Fatalf("%s %s: spec: %v", o.Kind, o.Metadata.Name, err)
	}
}

func subsetOf(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func TestKubernetesManifests(t *testing.T) {
	objs := loadK8s(t)
	secrets := map[string]map[string]string{}
	for _, o := range objs {
		if o.Kind == "Secret" {
			secrets[o.Metadata.Name] = o.StringData
		}
	}
	type deployment struct {
		name    string
		command string
		spec    deploymentSpec
	}
	var deps []deployment
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.Kind]++
		if o.Kind != "Deployment" {
			continue
		}
		var spec deploymentSpec
		decodeSpec(t, o, &spec)
		where := "Deployment " + o.Metadata.Name
		if !subsetOf(spec.Selector.MatchLabels, spec.Template.Metadata.Labels) {
			t.Errorf("%s: selector %v does not match its pod labels %v", where, spec.Selector.MatchLabels, spec.Template.Metadata.Labels)
		}
		if !spec.Template.Spec.SecurityContext.RunAsNonRoot || spec.Template.Spec.SecurityContext.RunAsUser == 0 {
			t.Errorf("%s: pods must run as a non-root user", where)
		}
		volumes := map[string]bool{}
		sizeLimits := map[string]string{} // emptyDir volumes' sizeLimit
		for _, v := range spec.Template.Spec.Volumes {
			volumes[v.Name] = true
			if v.EmptyDir != nil {
				sizeLimits[v.Name] = v.EmptyDir.SizeLimit
			}
		}
		for _, c := range spec.Template.Spec.Containers {
			cw := where + " container " + c.Name
			env := map[string]string{}
			for _, e := range c.Env {
				env[e.Name] = e.Value
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					ref := e.ValueFrom.SecretKeyRef
					keys, ok := secrets[ref.Name]
					if _, has := keys[ref.Key]; !ok || !has {
						t.Errorf("%s: %s reads secret %s key %s, which the example Secret does not have", cw, e.Name, ref.Name, ref.Key)
					}
					env[e.Name] = "(secret)"
				}
			}
			command, set := checkInvocation(t, cw, c.Args, env)
			deps = append(deps, deployment{o.Metadata.Name, command, spec})
			ports := map[string]int{}
			for _, p := range c.Ports {
				ports[p.Name] = p.ContainerPort
			}
			_, httpPort, _ := strings.Cut(set["http-listen"], ":")
			if strings.HasPrefix(set["http-listen"], "127.") || fmt.Sprint(ports["http"]) != httpPort {
				t.Errorf("%s: --http-listen %q must listen on all interfaces on the port named http (%d)", cw, set["http-listen"], ports["http"])
			}
			for _, pr := range []struct {
				name string
				p    *probe
				path string
			}{{"livenessProbe", c.LivenessProbe, "/healthz"}, {"readinessProbe", c.ReadinessProbe, "/readyz"}} {
				if pr.p == nil || pr.p.HTTPGet.Path != pr.path || pr.p.HTTPGet.Port != "http" {
					t.Errorf("%s: %s must GET %s on port http", cw, pr.name, pr.path)
				}
			}
			for _, m := range c.VolumeMounts {
				if !volumes[m.Name] {
					t.Errorf("%s mounts undeclared volume %s", cw, m.Name)
				}
			}
			if dir := set["spill-dir"]; dir != "" {
				mounted := false
				for _, m := range c.VolumeMounts {
					mounted = mounted || dir == m.MountPath || strings.HasPrefix(dir, m.MountPath+"/")
				}
				if !mounted {
					t.Errorf("%s: --spill-dir %s is not on a mounted volume (the root filesystem is read-only)", cw, dir)
				}
				checkSpillVolume(t, cw, dir, set["max-transaction-bytes"], c.VolumeMounts, sizeLimits)
			}
			switch command {
			case "run":
				requireSet(t, cw, set, "database-url", "publication", "nats-url")
				if spec.Replicas != 2 {
					t.Errorf("%s: %d replicas, want 2 (active and standby)", cw, spec.Replicas)
				}
			case "sync":
				requireSet(t, cw, set, "nats-url", "journal-url", "cursor-secret", "jwt-secret", "listen")
				_, wsPort, _ := strings.Cut(set["listen"], ":")
				if fmt.Sprint(ports["ws"]) != wsPort {
					t.Errorf("%s: --listen %s is not the port named ws (%d)", cw, set["listen"], ports["ws"])
				}
			}
		}
	}
	commands := map[string]bool{}
	for _, d := range deps {
		commands[d.command] = true
	}
	if !commands["run"] || !commands["sync"] {
		t.Errorf("want Deployments for run and sync, got %v", commands)
	}
	matches := func(sel map[string]string, command string) bool {
		for _, d := range deps {
			if d.command == command && subsetOf(sel, d.spec.Template.Metadata.Labels) {
				return true
			}
		}
		return false
	}
	pdbs := map[string]bool{}
	for _, o := range objs {
		switch o.Kind {
		case "PodDisruptionBudget":
			var s selectorSpec
			decodeSpec(t, o, &s)
			for _, cmd := range []string{"run", "sync"} {
				if matches(s.Selector.MatchLabels, cmd) {
					pdbs[cmd] = true
				}
			}
		case "Service":
			var s serviceSpec
			decodeSpec(t, o, &s)
			if !matches(s.Selector, "sync") {
				t.Errorf("Service %s selects no sync pods (selector %v)", o.Metadata.Name, s.Selector)
			}
			for _, p := range s.Ports {
				if p.TargetPort != "ws" && p.TargetPort != "http" {
					t.Errorf("Service %s targets port %v, not a named container port", o.Metadata.Name, p.TargetPort)
				}
			}
		}
	}
	if !pdbs["run"] {
		t.Error("no PodDisruptionBudget for the run pods")
	}
	if kinds["Service"] == 0 || kinds["Secret"] == 0 {
		t.Errorf("want a Service and an example Secret, got %v", kinds)
	}
	for name, keys := range secrets {
		for k, v := range keys {
			if v != "" && !strings.Contains(v, "CHANGE-ME") {
				t.Errorf("example Secret %s key %s holds a value that looks real; use CHANGE-ME placeholders", name, k)
			}
		}
	}
}

// --- systemd --------------------------------------------------------------------

// parseUnit reads a systemd unit into section → key → values.
func parseUnit(t *testing.T, path string) map[string]map[string][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	unit := map[string]map[string][]string{}
	section := ""
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
			unit[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not a key=value line in a section: %q", path, i+1, line)
			}
			unit[section][k] = append(unit[section][k], v)
		}
	}
	return unit
}

// parseEnvFile reads a systemd EnvironmentFile.
func parseEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || !strings.HasPrefix(k, "WALCAST_") {
			t.Errorf("%s:%d: want WALCAST_NAME=value, got %q", path, i+1, line)
		}
		env[k] = v
	}
	return env
}

// checkSpillVolume: an emptyDir with a sizeLimit that holds the spill
// directory must be larger than --max-transaction-bytes (its default when
// unset), the most in-progress transactions may hold there; otherwise a
// transaction below the bound gets the pod evicted, and the restarted pod
// decodes it again and is evicted again.
func checkSpillVolume(t *testing.T, where, dir, bound string, mounts []volumeMount, sizeLimits map[string]string) {
	t.Helper()
	max := int64(decoder.DefaultMaxTransactionBytes)
	if bound != "" {
		v, err := strconv.ParseInt(bound, 10, 64)
		if err != nil {
			t.Errorf("%s: --max-transaction-bytes %q is not a number of bytes", where, bound)
			return
		}
		max = v
	}
	for _, m := range mounts {
		if dir != m.MountPath && !strings.HasPrefix(dir, m.MountPath+"/") || sizeLimits[m.Name] == "" {
			continue
		}
		size, ok := quantityBytes(sizeLimits[m.Name])
		if !ok {
			t.Errorf("%s: volume %s: sizeLimit %q is not a quantity this check reads", where, m.Name, sizeLimits[m.Name])
			continue
		}
		if max >= size {
			t.Errorf("%s: --max-transaction-bytes %d does not fit the spill volume %s (sizeLimit %s, %d bytes)", where, max, m.Name, sizeLimits[m.Name], size)
		}
	}
}

// quantityBytes reads a Kubernetes quantity of bytes with a binary or
// decimal suffix (10Gi, 500M) or none.
func quantityBytes(q string) (int64, bool) {
	mult := int64(1)
	for _, s := range []struct {
		suffix string
		mult   int64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}} {
		if strings.HasSuffix(q, s.suffix) {
			q, mult = strings.TrimSuffix(q, s.suffix), s.mult
			break
		}
	}
	v, err := strconv.ParseInt(q, 10, 64)
	return v * mult, err == nil && v > 0
}

func TestSystemdUnits(t *testing.T) {
	units, _ := filepath.Glob("systemd/*.service")
	sort.Strings(units)
	if len(units) != 2 {
		t.Fatalf("want units for run and sync, got %v", units)
	}
	commands := map[string]bool{}
	for _, path := range units {
		u := parseUnit(t, path)
		svc := u["Service"]
		one := func(key string) string {
			if len(svc[key]) != 1 {
				t.Errorf("%s: want one %s=, got %v", path, key, svc[key])
				return ""
			}
			return svc[key][0]
		}
		exec := strings.Fields(one("ExecStart"))
		if len(exec) < 2 || filepath.Base(exec[0]) != "walcast" {
			t.Fatalf("%s: ExecStart %v is not walcast", path, exec)
		}
		envFile := one("EnvironmentFile")
		example := filepath.Join("systemd", strings.TrimSuffix(filepath.Base(strings.TrimPrefix(envFile, "-")), ".env")+".env.example")
		env := parseEnvFile(t, example)
		command, set := checkInvocation(t, path+" with "+example, exec[1:], env)
		commands[command] = true
		if one("Restart") != "on-failure" || one("RestartSec") == "" {
			t.Errorf("%s: want Restart=on-failure with a RestartSec", path)
		}
		if !slices.Contains(strings.Fields(one("RestartPreventExitStatus")), "2") {
			t.Errorf("%s: exit 2 (configuration error) should not be restarted", path)
		}
		for k, want := range map[string]string{"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
			"PrivateTmp": "yes", "DynamicUser": "yes", "CapabilityBoundingSet": ""} {
			if got := one(k); got != want {
				t.Errorf("%s: %s=%s, want %s", path, k, got, want)
			}
		}
		if dir := set["spill-dir"]; dir != "" {
			writable := false
			for _, d := range svc["StateDirectory"] {
				writable = writable || dir == "/var/lib/"+d || strings.HasPrefix(dir, "/var/lib/"+d+"/")
			}
			for _, d := range svc["ReadWritePaths"] {
				writable = writable || dir == d || strings.HasPrefix(dir, d+"/")
			}
			if !writable {
				t.Errorf("%s: --spill-dir %s is read-only under ProtectSystem=strict (add it to ReadWritePaths or StateDirectory)", path, dir)
			}
		}
		if u["Install"]["WantedBy"] == nil {
			t.Errorf("%s: no [Install] WantedBy", path)
		}
		systemdVerify(t, path)
	}
	if !commands["run"] || !commands["sync"] {
		t.Errorf("want units for run and sync, got %v", commands)
	}
}

// systemdVerify runs `systemd-analyze verify` on a copy of the unit whose
// ExecStart points at the test's walcast binary, when systemd-analyze is
// installed (it is on Debian with systemd; minimal CI images may lack it, and
// the checks above still run there).
func systemdVerify(t *testing.T, path string) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Logf("systemd-analyze not installed; %s checked by the parser only", path)
		return
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(t.TempDir(), filepath.Base(path))
	if err := os.WriteFile(tmp, bytes.ReplaceAll(b, []byte("/usr/local/bin/walcast"), []byte(walcastBin)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", "--man=no", tmp).CombinedOutput()
	var unknown []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		// Messages about the host (no such unit as postgresql.service on
		// this machine) are not the unit's fault.
		if line == "" || strings.Contains(line, "postgresql.service") || strings.Contains(line, "walcast-run.service") && !strings.HasPrefix(line, tmp) {
			continue
		}
		unknown = append(unknown, line)
	}
	if err != nil || len(unknown) > 0 {
		t.Errorf("systemd-analyze verify %s: %v\n%s", path, err, strings.Join(unknown, "\n"))
	}
}
