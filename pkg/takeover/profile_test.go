package takeover

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

const testSocket = "/run/inplaced/takeover.sock"

func TestProfile(t *testing.T) {
	allow := func(names ...string) specs.LinuxSyscall {
		return specs.LinuxSyscall{Names: names, Action: specs.ActAllow}
	}
	errno := specs.ActErrno
	cases := []struct {
		name     string
		base     *specs.LinuxSeccomp
		listener string
		swap     string
		want     error  // errors.Is
		wantErr  string // or a substring
		rules    []specs.LinuxSyscall
	}{
		{
			name: "bind leaves a rule of many", swap: "s1",
			base:  &specs.LinuxSeccomp{DefaultAction: errno, Syscalls: []specs.LinuxSyscall{allow("accept", "bind", "brk")}},
			rules: []specs.LinuxSyscall{allow("accept", "brk")},
		},
		{
			name: "a rule of bind alone goes", swap: "s1",
			base:  &specs.LinuxSeccomp{DefaultAction: errno, Syscalls: []specs.LinuxSyscall{allow("bind"), allow("brk")}},
			rules: []specs.LinuxSyscall{allow("brk")},
		},
		{
			name: "unconfined: the trap is the only rule", swap: "s1", base: Unconfined(),
		},
		{
			name: "logged bind counts as allowed", swap: "s1",
			base:  &specs.LinuxSeccomp{DefaultAction: errno, Syscalls: []specs.LinuxSyscall{{Names: []string{"bind"}, Action: specs.ActLog}}},
			rules: nil,
		},
		{
			name: "bind denied by the default action", swap: "s1",
			base: &specs.LinuxSeccomp{DefaultAction: errno, Syscalls: []specs.LinuxSyscall{allow("brk")}},
			want: ErrBindRestricted,
		},
		{
			name: "bind denied by a rule", swap: "s1",
			base: &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{{Names: []string{"bind"}, Action: errno}}},
			want: ErrBindRestricted,
		},
		{
			name: "bind allowed only for some arguments", swap: "s1",
			base: &specs.LinuxSeccomp{DefaultAction: errno, Syscalls: []specs.LinuxSyscall{{
				Names: []string{"bind"}, Action: specs.ActAllow,
				Args: []specs.LinuxSeccompArg{{Index: 2, Value: 16, Op: specs.OpEqualTo}},
			}}},
			want: ErrBindRestricted,
		},
		{
			name: "the pod's profile has its own agent", swap: "s1",
			base: &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, ListenerPath: "/run/other.sock"},
			want: ErrHasListener,
		},
		{name: "no base", swap: "s1", wantErr: "no base"},
		{name: "relative socket", swap: "s1", base: Unconfined(), listener: "run/x.sock", wantErr: "absolute"},
		{name: "no swap name", base: Unconfined(), wantErr: "swap name"},
		{name: "swap name too long", swap: strings.Repeat("x", MaxSwapLen+1), base: Unconfined(), wantErr: "swap name"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			listener := c.listener
			if listener == "" {
				listener = testSocket
			}
			var before []byte
			if c.base != nil {
				before, _ = json.Marshal(c.base)
			}
			b, err := Profile(c.base, listener, c.swap)
			if c.base != nil {
				if after, _ := json.Marshal(c.base); string(after) != string(before) {
					t.Errorf("the base profile changed:\n%s\n%s", before, after)
				}
			}
			switch {
			case c.want != nil || c.wantErr != "":
				if err == nil || (c.want != nil && !errors.Is(err, c.want)) || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err %v, want %v %q", err, c.want, c.wantErr)
				}
				return
			case err != nil:
				t.Fatal(err)
			}
			p := decodeProfile(t, b)
			if p.ListenerPath != listener || p.ListenerMetadata != c.swap || p.DefaultAction != c.base.DefaultAction {
				t.Errorf("listener %q metadata %q default %s", p.ListenerPath, p.ListenerMetadata, p.DefaultAction)
			}
			want := append(slices.Clone(c.rules), specs.LinuxSyscall{Names: []string{"bind"}, Action: specs.ActNotify})
			if !reflect.DeepEqual(p.Syscalls, want) {
				t.Errorf("rules\n got %+v\nwant %+v", p.Syscalls, want)
			}
		})
	}
}

// RuntimeDefault with the trap: containerd's rules as they are, bind
// moved from the allow list to one notify rule, for the capability sets
// that change the rules.
func TestProfileRuntimeDefault(t *testing.T) {
	for _, caps := range [][]string{
		nil,
		{"CAP_NET_BIND_SERVICE", "CAP_KILL", "CAP_AUDIT_WRITE"},
		{"CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "CAP_BPF"},
	} {
		base := RuntimeDefault(caps)
		b, err := Profile(base, testSocket, "swap-1")
		if err != nil {
			t.Fatalf("%v: %v", caps, err)
		}
		p := decodeProfile(t, b)
		if p.DefaultAction != specs.ActErrno || !reflect.DeepEqual(p.Architectures, base.Architectures) {
			t.Errorf("%v: default %s arches %v", caps, p.DefaultAction, p.Architectures)
		}
		if got, want := ruleSet(p.Syscalls), ruleSet(base.Syscalls); len(got) != len(want) {
			t.Errorf("%v: %d rule entries, want the base's %d", caps, len(got), len(want))
		} else {
			for k, v := range want {
				if k.name == "bind" {
					k.action = specs.ActNotify
				}
				if got[k] != v {
					t.Errorf("%v: %s %s %s: %d rules, want %d", caps, k.name, k.action, k.args, got[k], v)
				}
			}
		}
	}
}

// ruleKey is one syscall of one rule: what a filter gets from it.
type ruleKey struct {
	name   string
	action specs.LinuxSeccompAction
	args   string
}

func ruleSet(rules []specs.LinuxSyscall) map[ruleKey]int {
	out := map[ruleKey]int{}
	for _, r := range rules {
		args, _ := json.Marshal(r.Args)
		if len(r.Args) == 0 {
			args = nil
		}
		for _, n := range r.Names {
			out[ruleKey{n, r.Action, string(args)}]++
		}
	}
	return out
}

func decodeProfile(t *testing.T, b []byte) *specs.LinuxSeccomp {
	t.Helper()
	// As containerd reads a Localhost profile: strictly into the spec type.
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	var p specs.LinuxSeccomp
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("profile JSON: %v\n%s", err, b)
	}
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil || raw["listenerPath"] == nil || raw["listenerMetadata"] == nil {
		t.Fatalf("listenerPath and listenerMetadata are not in the JSON: %v\n%s", err, b)
	}
	return &p
}
