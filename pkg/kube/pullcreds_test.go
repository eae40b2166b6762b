package kube

import (
	"errors"
	"testing"
)

func TestPullFailureKind(t *testing.T) {
	for msg, want := range map[string]string{
		// containerd 2.4 and 1.6 against docker-registry with htpasswd, no
		// credentials (TestKubernetesCredentials), and a missing tag.
		`failed to pull and unpack image "127.0.0.1:40681/team/solo:v2": failed to resolve image: pull access denied, repository does not exist or may require authorization: authorization failed: no basic auth credentials`: pullUnauthorized,
		`failed to pull and unpack image "127.0.0.1:41243/late/app:v2": failed to resolve reference "127.0.0.1:41243/late/app:v2": pulling from host 127.0.0.1:41243 failed with status code [manifests v2]: 401 Unauthorized`: pullUnauthorized,
		`failed to pull and unpack image "127.0.0.1:43137/app:does-not-exist": failed to resolve image: 127.0.0.1:43137/app:does-not-exist: not found`:                                                                         pullNotFound,
		// A registry whose port holds a status code's digits.
		`failed to pull and unpack image "127.0.0.1:40185/app:does-not-exist": failed to resolve image: 127.0.0.1:40185/app:does-not-exist: not found`:                                                            pullNotFound,
		`failed to pull and unpack image "127.0.0.1:44031/app:v2": failed to resolve reference "127.0.0.1:44031/app:v2": pulling from host 127.0.0.1:44031 failed with status code [manifests v2]: 403 Forbidden`: pullUnauthorized,
		`failed to copy: httpReadSeeker: failed open: failed to do request: dial tcp 127.0.0.1:1: connect: connection refused`:                                                                                    pullFailed,
	} {
		if got := pullFailureKind(errors.New(msg)); got != want {
			t.Errorf("pullFailureKind(%q) = %q, want %q", msg, got, want)
		}
	}
}

func TestDecidePullFailure(t *testing.T) {
	complete := lookup{repo: "r/app", complete: true, describe: "no credentials for r/app in ..."}
	gap := lookup{repo: "r/app", describe: "...; not available to inplaced: pull secret ns/x: forbidden"}
	for _, tc := range []struct {
		name, policy, kind string
		l                  lookup
		pass               bool
	}{
		{"unauthorized, every source read: kubelet would be refused too", KeepRunning, pullUnauthorized, complete, false},
		{"unauthorized, a source out of reach: kubelet may have more", KeepRunning, pullUnauthorized, gap, true},
		{"not found with credentials: a bad tag", KeepRunning, pullNotFound, complete, false},
		{"not found with a gap: still a bad tag", KeepRunning, pullNotFound, gap, false},
		{"other failure", KeepRunning, pullFailed, complete, false},
		{"pass-through policy", PassThrough, pullNotFound, complete, true},
	} {
		v := decidePullFailure(tc.policy, tc.kind, tc.l)
		if v.pass != tc.pass || v.why == "" || v.todo == "" || v.kind != tc.kind {
			t.Errorf("%s: %+v, want pass=%v with a reason and what to do", tc.name, v, tc.pass)
		}
	}
}
