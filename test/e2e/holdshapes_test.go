package e2e

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inplaced/inplaced/test/harness"
)

// appShape is one way real images run their server, as the test app
// reproduces it (test/images/app: -spawn-depth, -backlog, -serial,
// -listen with networks and several addresses).
type appShape struct {
	name          string
	command, args []string
	// dial are the client's targets: "4:8080" the pod's IPv4 address,
	// "6:8080" its IPv6 one.
	dial []string
	// ports is what the record must say was held.
	ports string
	// sidecar are the args of a second container; its port is dialled
	// too, and must never wait.
	sidecar     []string
	sidecarDial string
	declared    string
	swapArgs    []string
}

var appShapes = []appShape{
	{name: "pid 1", dial: []string{"4:8080"}, ports: "[8080]"},
	{name: "child of a shell", command: []string{"/bin/sh", "-c", `trap 'kill $p; wait $p' TERM; /app & p=$!; wait $p`},
		dial: []string{"4:8080"}, ports: "[8080]", declared: `[{"containerPort":8080,"protocol":"TCP"}]`},
	{name: "two levels under an init", args: []string{"-spawn-depth=2"}, dial: []string{"4:8080"}, ports: "[8080]"},
	{name: "backlog 5, serial", args: []string{"-backlog=5", "-serial"}, dial: []string{"4:8080"}, ports: "[8080]"},
	{name: "IPv6 only", args: []string{"-listen=tcp6/[::]:8080"}, dial: []string{"6:8080"}, ports: "[8080]"},
	{name: "dual stack", args: []string{"-listen=tcp/[::]:8080"}, dial: []string{"4:8080", "6:8080"}, ports: "[8080]"},
	{name: "IPv4 and IPv6 sockets", args: []string{"-listen=tcp4/0.0.0.0:8080,tcp6/[::]:8080"}, dial: []string{"4:8080", "6:8080"}, ports: "[8080]"},
	{name: "two ports, listening late", args: []string{"-listen=:8080,:8081"}, dial: []string{"4:8080", "4:8081"}, ports: "[8080 8081]",
		swapArgs: []string{"--args", "-listen=:8080,:8081", "--args", "-listen-delay=300ms"}},
	{name: "sidecar port", dial: []string{"4:8080"}, ports: "[8080]", sidecar: []string{"-listen=:9090"}, sidecarDial: "4:9090",
		declared: `[{"containerPort":8080,"protocol":"TCP"},{"containerPort":9090,"protocol":"TCP"}]`},
}

// TestHoldAppShapes: a node-local swap v1 → v2 of each app shape under a
// client opening a new connection every 5 ms to each of its ports and
// families: nothing refused, reset or timed out, no connection slower than
// until the release + 50 ms, every port of the container held and none of
// a sidecar's, whose clients never wait.
func TestHoldAppShapes(t *testing.T) {
	requireNft(t)
	forEachBackend(t, func(t *testing.T, c *harness.Containerd) {
		e := newEnv(t, c)
		for i, sh := range appShapes {
			t.Run(sh.name, func(t *testing.T) { swapShape(t, e, fmt.Sprintf("shape%d", i), sh) })
		}
	}, harness.WithIPv6())
}

func swapShape(t *testing.T, e *env, name string, sh appShape) {
	p := runPod(t, e.cri, name, e.imgs.App1, podOpts{command: sh.command, args: sh.args, sidecar: sh.sidecar, ports: sh.declared})
	sb, sbInfo := sandboxInfo(t, e.cri, p.sandboxID)
	addr := func(target string) string {
		fam, port, _ := strings.Cut(target, ":")
		ip := sb.GetNetwork().GetIp()
		if fam == "6" {
			ip = ""
			for _, a := range sb.GetNetwork().GetAdditionalIps() {
				if strings.Contains(a.GetIp(), ":") {
					ip = a.GetIp()
				}
			}
			if ip == "" {
				t.Fatalf("the pod has no IPv6 address: %v", sb.GetNetwork())
			}
		}
		return net.JoinHostPort(ip, port)
	}
	targets := append([]string{}, sh.dial...)
	if sh.sidecarDial != "" {
		targets = append(targets, sh.sidecarDial)
	}
	for _, tg := range targets {
		eventually(t, 20*time.Second, "v1 answering on "+addr(tg), func() error { _, err := httpGet("http://" + addr(tg) + "/version"); return err })
	}
	checkNoHoldTable(t, sbInfo.Pid, "before the swap")
	dialers := map[string]*harness.Dialer{}
	for _, tg := range targets {
		dialers[tg] = harness.StartDialer(addr(tg))
	}
	time.Sleep(300 * time.Millisecond)
	out, _ := e.px.Ctl(append([]string{"swap", p.name, "-c", "app", "-o", "json", "--image", e.imgs.App2}, sh.swapArgs...)...)
	r := parseHoldSwap(t, out)
	time.Sleep(300 * time.Millisecond)
	dials := map[string][]harness.Dial{}
	for tg, d := range dialers {
		dials[tg] = d.End()
	}
	checkNoHoldTable(t, sbInfo.Pid, "after the swap")
	if r.Hold == nil {
		t.Fatalf("no hold in the record:\n%s", out)
	}
	t.Logf("state %s %s, hold %+v", r.State, r.Error, *r.Hold)
	if r.State != "SWAP_STATE_COMMITTED" || r.Hold.Mode != "queue" || r.Hold.Reason != "listening" || fmt.Sprint(r.Hold.Ports) != sh.ports {
		t.Fatalf("record: %s %s, hold %+v; want committed, queue on %s released for listening", r.State, r.Error, *r.Hold, sh.ports)
	}
	for _, tg := range sh.dial {
		s := harness.TallyDials(t, dials[tg])
		t.Logf("%s: %d connections %+v", tg, len(dials[tg]), s)
		if s.Failed() > 0 || s.ByVersion["v1"] == 0 || s.ByVersion["v2"] == 0 {
			t.Errorf("client on %s: %+v, want no failure, v1 then v2", tg, s)
		}
		harness.CheckWaits(t, dials[tg], r.released())
	}
	if sh.sidecarDial != "" {
		s := harness.TallyDials(t, dials[sh.sidecarDial])
		t.Logf("sidecar %s: %+v", sh.sidecarDial, s)
		// A held client waits about the hold's length; the sidecar's
		// waited only as long as the machine's load made them.
		ns, _ := strconv.ParseInt(r.Hold.DurationNs, 10, 64)
		held := time.Duration(ns)
		if s.Failed() > 0 || s.Slowest > max(held, 300*time.Millisecond) {
			t.Errorf("sidecar's clients: %+v, want none failed and none waiting as a held one does (the hold lasted %s)", s, held)
		}
	}
}
