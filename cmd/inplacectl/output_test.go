package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// fakeControl answers ListContainers and Watch from fixed data; every
// other method panics (the embedded nil interface).
type fakeControl struct {
	inplacedv1.ControlClient
	containers []*inplacedv1.ContainerInfo
	events     []*inplacedv1.Event
	gotList    *inplacedv1.ListContainersRequest
	gotWatch   *inplacedv1.WatchRequest
}

func (f *fakeControl) ListContainers(_ context.Context, req *inplacedv1.ListContainersRequest, _ ...grpc.CallOption) (*inplacedv1.ListContainersResponse, error) {
	f.gotList = req
	return &inplacedv1.ListContainersResponse{Containers: f.containers}, nil
}

func (f *fakeControl) Watch(_ context.Context, req *inplacedv1.WatchRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[inplacedv1.Event], error) {
	f.gotWatch = req
	return &fakeStream{events: f.events}, nil
}

type fakeStream struct {
	grpc.ClientStream
	events []*inplacedv1.Event
}

func (s *fakeStream) Header() (metadata.MD, error) { return metadata.MD{}, nil }

func (s *fakeStream) Recv() (*inplacedv1.Event, error) {
	if len(s.events) == 0 {
		return nil, io.EOF
	}
	ev := s.events[0]
	s.events = s.events[1:]
	return ev, nil
}

var resizedAt = time.Date(2026, 12, 3, 14, 5, 6, 0, time.Local)

func psFixture() *fakeControl {
	return &fakeControl{containers: []*inplacedv1.ContainerInfo{
		{Id: "0123456789abcdef0123", Namespace: "shop", Pod: "web", Container: "app", Image: "web:v2", State: "CONTAINER_RUNNING",
			Attempt: 1, KubeletHash: "9f1c", OverrideSwapId: "20261203T131520.884-4ec9ecce", OverrideImage: "web:v2",
			RunningSwapId: "swap-20261203-abcdef12", RunningStep: "health"},
		{Id: "fedcba", Namespace: "shop", Pod: "db", Container: "pg", Image: "pg:16", State: "CONTAINER_EXITED",
			RunningSwapId: "s2", RunningStep: "pull", // an ID shorter than the 8 characters shown
			LastResizeId: "r1", LastResizeResult: "applied", LastResizeUnixNano: resizedAt.UnixNano(), LastResizeEnforced: "on the host, for the whole sandbox"},
	}}
}

func TestPsTable(t *testing.T) {
	f := psFixture()
	var out bytes.Buffer
	if err := Ps(context.Background(), f, &PodFilter{Namespace: "shop", Pod: "web"}, "table", &out); err != nil {
		t.Fatal(err)
	}
	if f.gotList.Namespace != "shop" || f.gotList.Pod != "web" {
		t.Errorf("request %v: the filter was not passed on", f.gotList)
	}
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want a header and 2 rows:\n%s", len(lines), out.String())
	}
	for i, want := range [][]string{
		{"CONTAINER", "POD/CONTAINER", "STATE", "#", "IMAGE", "HASH", "OVERRIDE", "(SWAP)", "SWAP", "RUNNING", "LAST", "RESIZE"},
		{"0123456789abc", "shop/web/app", "RUNNING", "1", "web:v2", "9f1c", "20261203T131520.884-4ec9ecce", "abcdef12", "health", "-"},
		{"fedcba", "shop/db/pg", "EXITED", "0", "pg:16", "-", "-", "s2", "pull", "applied", resizedAt.Format("01-02"), resizedAt.Format("15:04:05"),
			"(enforced", "on", "the", "host,", "for", "the", "whole", "sandbox)"},
	} {
		if got := strings.Fields(lines[i]); strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("line %d:\n got %q\nwant %q", i, got, want)
		}
	}
	// Columns line up under their headers, a full swap ID included.
	for _, c := range []struct{ header, row1, row2 string }{
		{"POD/CONTAINER", "shop/web/app", "shop/db/pg"},
		{"SWAP RUNNING", "abcdef12", "s2 pull"},
		{"LAST RESIZE", "-", "applied"},
	} {
		col := strings.Index(lines[0], c.header)
		for i, want := range []string{c.row1, c.row2} {
			if l := lines[i+1]; len(l) < col || !strings.HasPrefix(l[col:], want) {
				t.Errorf("%s: row %d not aligned with the header:\n%s\n%s", c.header, i+1, lines[0], l)
			}
		}
	}
}

func TestPsStructured(t *testing.T) {
	want := &inplacedv1.ListContainersResponse{Containers: psFixture().containers}
	for _, format := range []string{"json", "yaml"} {
		t.Run(format, func(t *testing.T) {
			var out bytes.Buffer
			if err := Ps(context.Background(), psFixture(), &PodFilter{}, format, &out); err != nil {
				t.Fatal(err)
			}
			data := out.Bytes()
			if format == "yaml" {
				if bytes.HasPrefix(bytes.TrimSpace(data), []byte("{")) {
					t.Fatalf("-o yaml printed JSON:\n%s", data)
				}
				var err error
				if data, err = yaml.YAMLToJSON(data); err != nil {
					t.Fatalf("-o yaml: %v\n%s", err, out.String())
				}
			}
			// Field names are the proto names (snake_case), as the e2e tests and scripts read them.
			for _, key := range []string{`"override_swap_id"`, `"running_step"`, `"last_resize_unix_nano"`, `"kubelet_hash"`} {
				if !bytes.Contains(data, []byte(key)) {
					t.Errorf("no %s in\n%s", key, data)
				}
			}
			got := &inplacedv1.ListContainersResponse{}
			if err := protojson.Unmarshal(data, got); err != nil {
				t.Fatalf("-o %s does not parse back: %v\n%s", format, err, data)
			}
			if !proto.Equal(got, want) {
				t.Errorf("-o %s round trip:\n got %v\nwant %v", format, got, want)
			}
		})
	}
}

func watchFixture() *fakeControl {
	at := time.Date(2026, 12, 3, 14, 5, 6, 789_000_000, time.Local).UnixNano()
	return &fakeControl{events: []*inplacedv1.Event{
		{Kind: "swap-started", Namespace: "shop", Pod: "web", Container: "app", SwapId: "s1", Message: "swap by uid=0 pid=7", TimeUnixNano: at},
		{Kind: "step-done", Namespace: "shop", Pod: "web", Container: "app", SwapId: "s1", Step: "pull", Message: "done in 1.2s", TimeUnixNano: at + 1},
		{Kind: "swap-ended", Namespace: "shop", Pod: "web", Container: "app", SwapId: "s1", State: "COMMITTED", Message: "v1 → v2", TimeUnixNano: at + 2},
		{Kind: "recovered", SwapId: "s0", Message: "journaled swap settled", TimeUnixNano: at + 3},
		{Kind: "resize", Namespace: "shop", Pod: "db", Container: "pg", ResizeId: "r1", State: "applied", Message: "cpu", TimeUnixNano: at + 4},
	}}
}

func TestWatchOutput(t *testing.T) {
	t.Run("table", func(t *testing.T) {
		f := watchFixture()
		var out bytes.Buffer
		if err := Watch(context.Background(), f, &PodFilter{Namespace: "shop", Pod: "web"}, "table", &out); err != nil {
			t.Fatal(err)
		}
		if f.gotWatch.Namespace != "shop" || f.gotWatch.Pod != "web" {
			t.Errorf("request %v: the filter was not passed on", f.gotWatch)
		}
		want := [][]string{
			{"14:05:06.789", "swap-started", "shop/web/app", "s1", "swap", "by", "uid=0", "pid=7"},
			{"14:05:06.789", "step-done", "shop/web/app", "s1", "pull", "done", "in", "1.2s"},
			{"14:05:06.789", "swap-ended", "shop/web/app", "s1", "COMMITTED", "v1", "→", "v2"},
			{"14:05:06.789", "recovered", "-", "s0", "journaled", "swap", "settled"},
			{"14:05:06.789", "resize", "shop/db/pg", "r1", "applied", "cpu"},
		}
		lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
		if len(lines) != len(want) {
			t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), out.String())
		}
		for i := range want {
			if got := strings.Fields(lines[i]); strings.Join(got, " ") != strings.Join(want[i], " ") {
				t.Errorf("line %d:\n got %q\nwant %q", i, got, want[i])
			}
		}
	})
	t.Run("json", func(t *testing.T) {
		var out bytes.Buffer
		if err := Watch(context.Background(), watchFixture(), &PodFilter{}, "json", &out); err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
		want := watchFixture().events
		if len(lines) != len(want) {
			t.Fatalf("%d lines, want one per event:\n%s", len(lines), out.String())
		}
		for i, l := range lines {
			ev := &inplacedv1.Event{}
			if err := protojson.Unmarshal([]byte(l), ev); err != nil || !proto.Equal(ev, want[i]) {
				t.Errorf("line %d %q: %v, %v", i, l, err, ev)
			}
			if !strings.Contains(l, `"time_unix_nano"`) {
				t.Errorf("line %d: proto field names expected: %s", i, l)
			}
		}
	})
	t.Run("yaml", func(t *testing.T) {
		var out bytes.Buffer
		if err := Watch(context.Background(), watchFixture(), &PodFilter{}, "yaml", &out); err != nil {
			t.Fatal(err)
		}
		docs := strings.Split(out.String(), "---\n")
		if docs[0] != "" || len(docs) != len(watchFixture().events)+1 {
			t.Fatalf("want one document per event after ---:\n%s", out.String())
		}
		for i, d := range docs[1:] {
			var m map[string]any
			if err := yaml.Unmarshal([]byte(d), &m); err != nil || m["kind"] != watchFixture().events[i].Kind {
				t.Errorf("document %d: %v %v\n%s", i, err, m, d)
			}
		}
	})
}

func TestProgressLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		u    *inplacedv1.PullProgress
		want string
	}{
		{"a quarter", &inplacedv1.PullProgress{Image: "large:v1", BytesKnown: true, BytesDone: 25 << 20, BytesTotal: 100 << 20,
			LayersDone: 1, LayersTotal: 3, BytesPerSecond: 5 << 20, EtaNs: int64(15*time.Second + 400*time.Millisecond)},
			"large:v1  [######..................]  25.0/100.0 MiB  1/3 layers  5.0 MiB/s  ETA 15s"},
		{"nothing yet", &inplacedv1.PullProgress{Image: "large:v1", BytesKnown: true},
			"large:v1  [........................]  0.0/0.0 MiB  0/0 layers  0.0 MiB/s  ETA -"},
		{"over the total", &inplacedv1.PullProgress{Image: "x", BytesKnown: true, BytesDone: 3 << 20, BytesTotal: 2 << 20},
			"x  [########################]  3.0/2.0 MiB  0/0 layers  0.0 MiB/s  ETA -"},
		{"done", &inplacedv1.PullProgress{Image: "large:v1", BytesKnown: true, Done: true, BytesDone: 100 << 20, BytesTotal: 100 << 20,
			LayersDone: 3, LayersTotal: 3, ElapsedNs: int64(4 * time.Second)},
			"large:v1  [########################]  100.0/100.0 MiB  3/3 layers  25.0 MiB/s  done in 4s"},
		{"CRI only", &inplacedv1.PullProgress{Image: "a", ElapsedNs: int64(1234 * time.Millisecond), Note: "no byte counts"},
			"a  pulling, 1.2s elapsed (no byte counts)"},
		{"CRI only, done", &inplacedv1.PullProgress{Image: "a", Done: true, ElapsedNs: int64(2 * time.Second), Note: "no byte counts"},
			"a  pulled in 2s (no byte counts)"},
		{"failed", &inplacedv1.PullProgress{Image: "a", BytesKnown: true, Done: true, Error: "not found", ElapsedNs: int64(time.Second)},
			"a  failed after 1s: not found"},
	} {
		if got := progressLine(tc.u); got != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got, tc.want)
		}
	}
}

// TestProgressPrinter: off a terminal, one line per update and no
// terminal control characters.
func TestProgressPrinter(t *testing.T) {
	var out bytes.Buffer
	p := newProgressPrinter(&out, "pull: ")
	p.update(&inplacedv1.PullProgress{Image: "a", Note: "n"})
	p.update(&inplacedv1.PullProgress{Image: "a", Note: "n", Done: true})
	p.end()
	if got, want := out.String(), "pull: a  pulling, 0s elapsed (n)\npull: a  pulled in 0s (n)\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestPrintSwaps(t *testing.T) {
	swaps := []*inplacedv1.SwapRecord{{Id: "s1", Kind: "swap", Namespace: "shop", Pod: "web", Container: "app",
		State: inplacedv1.SwapState_SWAP_STATE_FAILED, From: &inplacedv1.ConfigSummary{Image: "web:v1"},
		To: &inplacedv1.ConfigSummary{Image: "web:v2"}, DowntimeNs: int64(130 * time.Millisecond), RunningContainerId: "0123456789abcdef",
		Caller: &inplacedv1.Caller{Uid: 1000, Pid: 77, Exe: "/usr/local/bin/inplacectl"}, Error: "health: GET /healthz: 503"}}
	var out bytes.Buffer
	if err := printSwaps(&out, "table", swaps); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	want := "s1 swap shop/web/app FAILED web:v1 → web:v2 130ms 0123456789abc uid=1000 pid=77 /usr/local/bin/inplacectl"
	if len(lines) != 3 || strings.Join(strings.Fields(lines[1]), " ") != want || strings.TrimSpace(lines[2]) != "health: GET /healthz: 503" {
		t.Errorf("table:\n%s", out.String())
	}
	out.Reset()
	if err := printSwaps(&out, "json", swaps); err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Swaps []struct {
			ID     string `json:"id"`
			State  string `json:"state"`
			Caller struct {
				Exe string `json:"exe"`
			} `json:"caller"`
		} `json:"swaps"`
	}
	if err := json.Unmarshal(out.Bytes(), &parsed); err != nil || len(parsed.Swaps) != 1 || parsed.Swaps[0].State != "SWAP_STATE_FAILED" ||
		parsed.Swaps[0].Caller.Exe != "/usr/local/bin/inplacectl" {
		t.Errorf("json: %v %+v\n%s", err, parsed, out.String())
	}
}

// The strategy line says which strategy ran, what was handed over, and
// why an overlap fell back.
func TestStrategySummary(t *testing.T) {
	for _, tc := range []struct {
		rec  *inplacedv1.SwapRecord
		want string
	}{
		{&inplacedv1.SwapRecord{}, ""},
		{&inplacedv1.SwapRecord{Strategy: "stop-first", StrategyWhy: "the node's default (--swap-strategy)"},
			"stop-first (the node's default (--swap-strategy))"},
		{&inplacedv1.SwapRecord{Strategy: "overlap", StrategyWhy: "asked for by the request",
			Takeover: &inplacedv1.TakeoverRecord{Ports: []uint32{8080, 8081}, HandedOver: []uint32{8080, 8081}, HandoverNs: 1_234_567}},
			"overlap: 8080,8081 handed over in 1.23ms (asked for by the request)"},
		{&inplacedv1.SwapRecord{Strategy: "stop-first", StrategyWhy: "overlap fell back to stop-first with the connection hold: x",
			Takeover: &inplacedv1.TakeoverRecord{Ports: []uint32{8080}, FellBack: true}},
			"stop-first (overlap fell back to stop-first with the connection hold: x)"},
	} {
		if got := tc.rec.StrategySummary(); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.rec, got, tc.want)
		}
	}
}
