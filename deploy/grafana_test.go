package deploy

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// instrumentCall matches the start of an OpenTelemetry instrument created in
// walcast's source: its kind and name; callArgs finds the rest of the call.
var instrumentCall = regexp.MustCompile(`\.(Int64|Float64)(Observable)?(Counter|UpDownCounter|Gauge|Histogram)\(\s*"(walcast\.[^"]+)"`)

// callArgs returns src up to the parenthesis that closes a call whose
// argument list is open at the start of src, skipping parentheses inside
// string literals.
func callArgs(src string) string {
	depth := 1
	for i := 0; i < len(src); i++ {
		switch src[i] {
		case '"':
			for i++; i < len(src) && src[i] != '"'; i++ {
				if src[i] == '\\' {
					i++
				}
			}
		case '`':
			for i++; i < len(src) && src[i] != '`'; i++ {
			}
		case '(':
			depth++
		case ')':
			if depth--; depth == 0 {
				return src[:i]
			}
		}
	}
	return src
}

var unitOption = regexp.MustCompile(`WithUnit\("([^"]*)"\)`)

// exportedMetrics returns the Prometheus series names walcast's instruments
// are exported under, derived from the source with the OTel Prometheus
// exporter's rules: dots become underscores, the unit becomes a suffix
// (By → _bytes, s → _seconds; annotations in braces are dropped), monotonic
// counters end in _total, histograms export _bucket, _sum and _count.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != ".." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		src := string(b)
		for _, loc := range instrumentCall.FindAllStringSubmatchIndex(src, -1) {
			kind, name, opts := src[loc[6]:loc[7]], src[loc[8]:loc[9]], callArgs(src[loc[1]:])
			base := strings.ReplaceAll(name, ".", "_")
			if u := unitOption.FindStringSubmatch(opts); u != nil {
				switch u[1] {
				case "By":
					base += "_bytes"
				case "s":
					base += "_seconds"
				case "ms":
					base += "_milliseconds"
				}
			}
			switch kind {
			case "Counter":
				names[base+"_total"] = true
			case "Histogram":
				for _, s := range []string{"_bucket", "_sum", "_count"} {
					names[base+s] = true
				}
			default: // gauges and up-down counters
				names[base] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Fatal("no walcast instruments found in the source")
	}
	return names
}

type grafanaPanel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource map[string]any `json:"datasource"`
	GridPos    struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"`
}

var seriesName = regexp.MustCompile(`\bwalcast_[a-z0-9_]+`)

func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("grafana/walcast.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID        string         `json:"uid"`
		Title      string         `json:"title"`
		Panels     []grafanaPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name, Type, Query string
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("grafana/walcast.json: %v", err)
	}
	if dash.UID == "" || dash.Title == "" {
		t.Error("the dashboard needs a uid and a title")
	}
	dsVar := ""
	for _, v := range dash.Templating.List {
		if v.Type == "datasource" && v.Query == "prometheus" {
			dsVar = "${" + v.Name + "}"
		}
	}
	if dsVar == "" {
		t.Fatal("no Prometheus datasource variable: the dashboard would be bound to one Grafana's datasource uid")
	}

	exported := exportedMetrics(t)
	used := map[string]bool{}
	ids := map[int]bool{}
	type cell struct{ x, y int }
	taken := map[cell]string{}
	var panels []grafanaPanel
	for _, p := range dash.Panels {
		panels = append(panels, p)
		panels = append(panels, p.Panels...)
	}
	for _, p := range panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		for x := p.GridPos.X; x < p.GridPos.X+p.GridPos.W; x++ {
			for y := p.GridPos.Y; y < p.GridPos.Y+p.GridPos.H; y++ {
				if other, ok := taken[cell{x, y}]; ok {
					t.Errorf("panels %q and %q overlap at %d,%d", p.Title, other, x, y)
				}
				taken[cell{x, y}] = p.Title
			}
		}
		if p.GridPos.X+p.GridPos.W > 24 || p.GridPos.W == 0 || p.GridPos.H == 0 {
			t.Errorf("panel %q: bad gridPos %+v", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Title == "" || len(p.Targets) == 0 {
			t.Errorf("panel %d: no title or no queries", p.ID)
		}
		if p.Datasource["uid"] != dsVar {
			t.Errorf("panel %q: datasource %v, want uid %s", p.Title, p.Datasource, dsVar)
		}
		for _, tg := range p.Targets {
			names := seriesName.FindAllString(tg.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q query %s: no walcast metric", p.Title, tg.RefID)
			}
			for _, n := range names {
				used[n] = true
				if !exported[n] {
					t.Errorf("panel %q queries %s, which walcast does not export", p.Title, n)
				}
			}
		}
	}
	// What the dashboard must show.
	for _, n := range []string{"walcast_replication_lag_bytes", "walcast_replication_role", "walcast_journal_changes_total",
		"walcast_journal_append_duration_seconds_bucket", "walcast_sync_sockets_open", "walcast_sync_frames_dropped_total",
		"walcast_sync_replay_gaps_total"} {
		if !used[n] {
			t.Errorf("the dashboard does not show %s", n)
		}
	}
	var unused []string
	for n := range exported {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")
		if !used[n] && !used[base+"_bucket"] {
			unused = append(unused, n)
		}
	}
	sort.Strings(unused)
	if len(unused) > 0 {
		t.Logf("exported but not on the dashboard: %v", unused)
	}
}
