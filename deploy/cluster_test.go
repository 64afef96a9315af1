package deploy

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// natsConf parses a NATS server configuration with nats-server's own
// parser, its $VARIABLES taken from env.
func natsConf(t *testing.T, where, body string, env map[string]string) *server.Options {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	f := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(f)
	if err != nil {
		t.Fatalf("%s: nats-server rejects it: %v", where, err)
	}
	return opts
}

// checkNATSClusterConf checks one server's parsed configuration: JetStream
// on with its store under storeRoot, a named cluster on 6222 routed to
// exactly wantRoutes (host:port), clients on 4222, and a max payload in
// the range docs/nats.md's sizing advice gives.
func checkNATSClusterConf(t *testing.T, where string, o *server.Options, name, storeRoot string, wantRoutes []string) {
	t.Helper()
	if o.ServerName != name {
		t.Errorf("%s: server_name %q, want %q (each server its own name: JetStream's raft needs it)", where, o.ServerName, name)
	}
	if !o.JetStream {
		t.Errorf("%s: JetStream is off", where)
	}
	if !strings.HasPrefix(o.StoreDir, storeRoot+"/") && o.StoreDir != storeRoot {
		t.Errorf("%s: JetStream store %q is not on the persistent volume at %s", where, o.StoreDir, storeRoot)
	}
	if o.Port != 4222 || o.Cluster.Port != 6222 || o.Cluster.Name == "" {
		t.Errorf("%s: client port %d, cluster port %d, cluster name %q: want 4222, 6222 and a name", where, o.Port, o.Cluster.Port, o.Cluster.Name)
	}
	var routes []string
	for _, r := range o.Routes {
		routes = append(routes, r.Host)
	}
	sort.Strings(routes)
	sort.Strings(wantRoutes)
	if !slices.Equal(routes, wantRoutes) {
		t.Errorf("%s: routes %v, want every server of the cluster %v", where, routes, wantRoutes)
	}
	// Past 1 MB (the default) an ordinary large row still travels whole;
	// past 64 MB (walcast's largest envelope) nothing is gained.
	if o.MaxPayload < 1<<20 || o.MaxPayload > 64<<20 {
		t.Errorf("%s: max_payload %d: want 1 MB to 64 MB (docs/nats.md: what to size)", where, o.MaxPayload)
	}
	if o.MaxPending < int64(o.MaxPayload)*4 {
		t.Errorf("%s: max_pending %d under four max-size messages (%d): a sync node would be cut off by one burst", where, o.MaxPending, o.MaxPayload)
	}
}

// checkJetStreamSettings checks walcast run's JetStream flags against the
// cluster: a stream named, as many replicas as servers (at most 5, an odd
// number), a duplicate window of at least a minute, and a journal that keeps
// at least as long a history as the stream.
func checkJetStreamSettings(t *testing.T, where string, set map[string]string, servers int) {
	t.Helper()
	requireSet(t, where, set, "jetstream-stream", "jetstream-replicas", "jetstream-max-age", "retention-max-age")
	if set["jetstream-replicas"] != fmt.Sprint(servers) || servers%2 == 0 || servers > 5 {
		t.Errorf("%s: --jetstream-replicas %s on %d NATS servers: want one replica per server, an odd number up to 5", where, set["jetstream-replicas"], servers)
	}
	if w := set["jetstream-duplicate-window"]; w != "" {
		if d, err := time.ParseDuration(w); err != nil || d < time.Minute {
			t.Errorf("%s: --jetstream-duplicate-window %s: walcast refuses less than 1m", where, w)
		}
	}
	age, err1 := time.ParseDuration(set["jetstream-max-age"])
	ret, err2 := time.ParseDuration(set["retention-max-age"])
	if err1 != nil || err2 != nil || age <= 0 || ret < age {
		t.Errorf("%s: --jetstream-max-age %s and --retention-max-age %s: the journal must keep at least what the stream keeps, so what the stream dropped can be read from the journal",
			where, set["jetstream-max-age"], set["retention-max-age"])
	}
}

// natsHosts returns the host:port of each nats:// URL in a comma-separated
// list.
func natsHosts(t *testing.T, where, list string) []string {
	t.Helper()
	var hosts []string
	for _, u := range strings.Split(list, ",") {
		p, err := url.Parse(strings.TrimSpace(u))
		if err != nil || p.Scheme != "nats" || p.Port() == "" {
			t.Errorf("%s: NATS URL %q: want nats://host:port", where, u)
			continue
		}
		hosts = append(hosts, p.Host)
	}
	sort.Strings(hosts)
	return hosts
}

// TestClusterComposeFile checks deploy/cluster: three NATS servers whose
// configuration nats-server accepts, routed to each other, JetStream on a
// volume each; two `walcast run` on one slot in JetStream mode with a
// replica per server; at least two sync nodes; every walcast connecting
// to every server.
func TestClusterComposeFile(t *testing.T) {
	const dir = "cluster"
	c := loadComposeFile(t, filepath.Join(dir, "compose.yaml"))
	conf, err := os.ReadFile(filepath.Join(dir, "nats.conf"))
	if err != nil {
		t.Fatal(err)
	}
	var natsServers []string
	for name, s := range c.Services {
		if strings.HasPrefix(s.Image, "nats:") {
			natsServers = append(natsServers, name)
		}
	}
	sort.Strings(natsServers)
	if len(natsServers) != 3 {
		t.Fatalf("want three NATS servers, got %v", natsServers)
	}
	var routes, clients []string
	for _, n := range natsServers {
		routes = append(routes, n+":6222")
		clients = append(clients, n+":4222")
	}
	hostPorts := map[string]string{}
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range c.Services {
			if !yield(k) {
				return
			}
		}
	}) {
		s := c.Services[name]
		where := "cluster/compose.yaml service " + name
		for dep := range s.DependsOn {
			if _, ok := c.Services[dep]; !ok {
				t.Errorf("%s depends on unknown service %s", where, dep)
			}
		}
		for _, p := range s.Ports {
			parts := strings.Split(p, ":")
			host := strings.Join(parts[:len(parts)-1], ":")
			if other, dup := hostPorts[host]; dup {
				t.Errorf("%s and %s both publish %s", where, other, host)
			}
			hostPorts[host] = name
		}
		mounts := map[string]string{}
		for _, v := range s.Volumes {
			src, rest, _ := strings.Cut(v, ":")
			dst, _, _ := strings.Cut(rest, ":")
			mounts[dst] = src
			if strings.HasPrefix(src, ".") {
				if _, err := os.Stat(filepath.Join(dir, src)); err != nil {
					t.Errorf("%s mounts %s: %v", where, src, err)
				}
			} else if _, ok := c.Volumes[src]; !ok {
				t.Errorf("%s mounts undeclared volume %s", where, src)
			}
		}
		if slices.Contains(natsServers, name) {
			i := slices.Index(s.Command, "-c")
			if i < 0 || i+1 >= len(s.Command) || mounts[s.Command[i+1]] != "./nats.conf" {
				t.Errorf("%s: command %v does not run the mounted ./nats.conf", where, s.Command)
			}
			if src := mounts["/data"]; src == "" || strings.HasPrefix(src, ".") {
				t.Errorf("%s: no named volume at /data for the JetStream store", where)
			}
			o := natsConf(t, where, string(conf), map[string]string{"SERVER_NAME": s.Environment["SERVER_NAME"]})
			checkNATSClusterConf(t, where, o, name, "/data", routes)
			continue
		}
		if !isWalcast(s) {
			continue
		}
		if s.Build != nil {
			if _, err := os.Stat(filepath.Join(dir, s.Build.Context, s.Build.Dockerfile)); err != nil {
				t.Errorf("%s builds %s in %s: %v", where, s.Build.Dockerfile, s.Build.Context, err)
			}
		}
		command, set := checkInvocation(t, where, s.Command, s.Environment)
		if command == "run" || command == "sync" {
			if got := natsHosts(t, where, set["nats-url"]); !slices.Equal(got, clients) {
				t.Errorf("%s: --nats-url reaches %v, want every server %v (it fails over among them)", where, got, clients)
			}
		}
		if command == "run" {
			checkJetStreamSettings(t, where, set, len(natsServers))
		}
	}
	checkComposeRoles(t, c, 2)
}

// checkComposeRoles: two `walcast run` on one slot and stream (active and
// standby), and at least minSync sync nodes.
func checkComposeRoles(t *testing.T, c composeFile, minSync int) {
	t.Helper()
	var runs []string
	slots, streams := map[string]bool{}, map[string]bool{}
	syncs := 0
	for name, s := range c.Services {
		if !isWalcast(s) {
			continue
		}
		command, set := checkInvocation(t, name, s.Command, s.Environment)
		switch command {
		case "run":
			runs = append(runs, name)
			slots[set["slot"]], streams[set["jetstream-stream"]] = true, true
		case "sync":
			syncs++
		}
	}
	if len(runs) != 2 || len(slots) != 1 || len(streams) != 1 {
		t.Errorf("want two `walcast run` on one slot and one stream (active and standby), got %v on slots %v, streams %v", runs, slots, streams)
	}
	if syncs < minSync {
		t.Errorf("want at least %d sync nodes, got %d", minSync, syncs)
	}
}

// TestKubernetesNATSCluster checks deploy/kubernetes/nats: a StatefulSet of
// three NATS servers whose configuration nats-server accepts, each routed
// to every pod by its stable name through a headless Service, JetStream on
// a volume claim; the Service nats.nats.svc that run.yaml and sync.yaml
// connect to; a PodDisruptionBudget that keeps a quorum; and run.yaml's
// JetStream flags fit it.
func TestKubernetesNATSCluster(t *testing.T) {
	objs := loadK8sGlob(t, "kubernetes/nats/*.yaml")
	type stsSpec struct {
		ServiceName string `yaml:"serviceName"`
		Replicas    int    `yaml:"replicas"`
		Selector    struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				Containers []struct {
					Name string   `yaml:"name"`
					Args []string `yaml:"args"`
					Env  []struct {
						Name      string `yaml:"name"`
						ValueFrom struct {
							FieldRef struct {
								FieldPath string `yaml:"fieldPath"`
							} `yaml:"fieldRef"`
						} `yaml:"valueFrom"`
					} `yaml:"env"`
					VolumeMounts []struct {
						Name      string `yaml:"name"`
						MountPath string `yaml:"mountPath"`
					} `yaml:"volumeMounts"`
				} `yaml:"containers"`
				Volumes []struct {
					Name      string `yaml:"name"`
					ConfigMap *struct {
						Name string `yaml:"name"`
					} `yaml:"configMap"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
		VolumeClaimTemplates []struct {
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
		} `yaml:"volumeClaimTemplates"`
	}
	type svcSpec struct {
		ClusterIP string            `yaml:"clusterIP"`
		Selector  map[string]string `yaml:"selector"`
		Ports     []struct {
			Port int `yaml:"port"`
		} `yaml:"ports"`
	}
	var sts *k8sObject
	services := map[string]svcSpec{}
	configMaps := map[string]map[string]string{}
	var pdbs []k8sObject
	for i, o := range objs {
		if o.Metadata.Namespace != "nats" {
			t.Errorf("%s %s is not in namespace nats (run.yaml and sync.yaml connect to nats.nats.svc)", o.Kind, o.Metadata.Name)
		}
		switch o.Kind {
		case "StatefulSet":
			sts = &objs[i]
		case "Service":
			var s svcSpec
			decodeSpec(t, o, &s)
			services[o.Metadata.Name] = s
		case "ConfigMap":
			configMaps[o.Metadata.Name] = o.Data
		case "PodDisruptionBudget":
			pdbs = append(pdbs, o)
		}
	}
	if sts == nil {
		t.Fatal("no StatefulSet")
	}
	var spec stsSpec
	decodeSpec(t, *sts, &spec)
	where := "StatefulSet " + sts.Metadata.Name
	labels := spec.Template.Metadata.Labels
	if !subsetOf(spec.Selector.MatchLabels, labels) {
		t.Errorf("%s: selector %v does not match its pod labels %v", where, spec.Selector.MatchLabels, labels)
	}
	if spec.Replicas != 3 {
		t.Errorf("%s: %d replicas, want 3 (an R3 stream)", where, spec.Replicas)
	}
	headless, ok := services[spec.ServiceName]
	if !ok || headless.ClusterIP != "None" || !subsetOf(headless.Selector, labels) {
		t.Errorf("%s: serviceName %q is not a headless Service selecting its pods", where, spec.ServiceName)
	}
	if client, ok := services["nats"]; !ok || !subsetOf(client.Selector, labels) || !slices.ContainsFunc(client.Ports, func(p struct {
		Port int `yaml:"port"`
	}) bool {
		return p.Port == 4222
	}) {
		t.Errorf("no Service nats on port 4222 selecting the NATS pods (run.yaml and sync.yaml connect to nats://nats.nats.svc:4222)")
	}
	if len(spec.Template.Spec.Containers) != 1 {
		t.Fatalf("%s: want one container", where)
	}
	ctr := spec.Template.Spec.Containers[0]
	podNameVar := ""
	for _, e := range ctr.Env {
		if e.ValueFrom.FieldRef.FieldPath == "metadata.name" {
			podNameVar = e.Name
		}
	}
	mounts := map[string]string{} // path → volume
	for _, m := range ctr.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	i := slices.Index(ctr.Args, "-c")
	if i < 0 || i+1 >= len(ctr.Args) {
		t.Fatalf("%s: args %v name no config file (-c)", where, ctr.Args)
	}
	confPath := ctr.Args[i+1]
	var body string
	for _, v := range spec.Template.Spec.Volumes {
		if v.Name == mounts[filepath.Dir(confPath)] && v.ConfigMap != nil {
			body = configMaps[v.ConfigMap.Name][filepath.Base(confPath)]
		}
	}
	if body == "" {
		t.Fatalf("%s: %s is not a key of a mounted ConfigMap", where, confPath)
	}
	if !strings.Contains(body, "$"+podNameVar) || podNameVar == "" {
		t.Errorf("%s: server_name does not come from the pod's name (env from metadata.name)", where)
	}
	storeRoot := ""
	for path, vol := range mounts {
		if len(spec.VolumeClaimTemplates) > 0 && vol == spec.VolumeClaimTemplates[0].Metadata.Name {
			storeRoot = path
		}
	}
	if storeRoot == "" {
		t.Errorf("%s: no volume claim mounted for the JetStream store", where)
	}
	var routes []string
	for n := 0; n < spec.Replicas; n++ {
		routes = append(routes, fmt.Sprintf("%s-%d.%s.nats.svc:6222", sts.Metadata.Name, n, spec.ServiceName))
	}
	for n := 0; n < spec.Replicas; n++ {
		pod := fmt.Sprintf("%s-%d", sts.Metadata.Name, n)
		o := natsConf(t, where+" pod "+pod, body, map[string]string{podNameVar: pod})
		checkNATSClusterConf(t, where+" pod "+pod, o, pod, storeRoot, routes)
		if o.PidFile != "" && mounts[filepath.Dir(o.PidFile)] == "" {
			t.Errorf("%s: pid_file %s is not on a mounted volume", where, o.PidFile)
		}
	}
	quorum := false
	for _, p := range pdbs {
		var s struct {
			MaxUnavailable int `yaml:"maxUnavailable"`
			Selector       struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
		}
		decodeSpec(t, p, &s)
		quorum = quorum || subsetOf(s.Selector.MatchLabels, labels) && s.MaxUnavailable >= 1 && spec.Replicas-s.MaxUnavailable > spec.Replicas/2
	}
	if !quorum {
		t.Errorf("no PodDisruptionBudget keeping a quorum (%d of %d) of the NATS pods", spec.Replicas/2+1, spec.Replicas)
	}

	// walcast's manifests use this cluster.
	for _, o := range loadK8s(t) {
		if o.Kind != "Deployment" {
			continue
		}
		var d deploymentSpec
		decodeSpec(t, o, &d)
		for _, c := range d.Template.Spec.Containers {
			env := map[string]string{}
			for _, e := range c.Env {
				env[e.Name] = e.Value
				if e.ValueFrom != nil {
					env[e.Name] = "(secret)"
				}
			}
			cw := "Deployment " + o.Metadata.Name
			command, set := checkInvocation(t, cw, c.Args, env)
			if command != "run" && command != "sync" {
				continue
			}
			if got := natsHosts(t, cw, set["nats-url"]); !slices.Equal(got, []string{"nats.nats.svc:4222"}) {
				t.Errorf("%s: --nats-url %v, want the cluster's Service nats.nats.svc:4222", cw, got)
			}
			if command == "run" {
				checkJetStreamSettings(t, cw, set, spec.Replicas)
			}
		}
	}
}
