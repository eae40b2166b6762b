package kube

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inplaced/inplaced/pkg/credentials"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// secretTimeout bounds reading a pull secret: the pull waits on it, and
// kubelet's held stop waits on the pull.
const secretTimeout = 5 * time.Second

// lookup is what a change keeps of its credentials lookup: where inplaced
// looked and whether that is everywhere kubelet looks. Never the
// credentials themselves.
type lookup struct {
	repo     string
	complete bool
	describe string
}

// pullAuths reads the pod's pull secrets (a node may read the secrets its
// pods reference) and returns the credentials kubelet would try for the
// image, in its order (package credentials: those secrets, then the node's
// docker config, then credential-provider plugins), with what the lookup
// covered.
func (ic *imageChanges) pullAuths(ch *change) ([]*inplacedv1.RegistryAuth, lookup) {
	req := credentials.Request{Image: ch.image}
	for _, name := range ch.pullSecrets {
		ctx, cancel := context.WithTimeout(ic.ctx(), secretTimeout)
		s, err := ic.client.Secrets(ch.namespace).Get(ctx, name, metav1.GetOptions{})
		cancel()
		switch {
		case apierrors.IsNotFound(err):
			// kubelet skips a pull secret that does not exist, too.
			req.Missing = append(req.Missing, ch.namespace+"/"+name)
		case err != nil:
			ic.log.Warn("cannot read pull secret; pulling without it", zap.String("secret", ch.namespace+"/"+name), zap.Error(err))
			req.Unreadable = append(req.Unreadable, fmt.Sprintf("pull secret %s/%s: %v", ch.namespace, name, err))
		default:
			req.Secrets = append(req.Secrets, s)
		}
	}
	res, err := ic.creds.Lookup(ic.ctx(), req)
	if err != nil {
		// An image kubelet cannot parse either: the pull says why.
		return nil, lookup{repo: ch.image, complete: true, describe: err.Error()}
	}
	l := lookup{repo: ch.image, complete: res.Complete(), describe: res.Describe(ch.image)}
	if repo, err := credentials.Repository(ch.image); err == nil {
		l.repo, l.describe = repo, res.Describe(repo)
	}
	if len(res.Gaps) > 0 {
		ic.log.Warn("credentials kubelet may have are not available to inplaced", zap.String("image", ch.image), zap.Strings("gaps", res.Gaps))
	}
	auths := make([]*inplacedv1.RegistryAuth, len(res.Credentials))
	for i, cr := range res.Credentials {
		// As kubelet's PullImage: username and password only.
		auths[i] = &inplacedv1.RegistryAuth{Username: cr.Username, Password: cr.Password}
	}
	return auths, l
}

// What a failed pull before kubelet's stop was, from the backend's error.
const (
	pullUnauthorized = "unauthorized"
	pullNotFound     = "not found"
	pullFailed       = "failed"
)

// pullFailureKind reads the backend's pull error: containerd reports a
// registry's 401/403 as "pull access denied ... authorization failed",
// "401 Unauthorized" or "403 Forbidden", a missing tag as "<ref>: not
// found". Status codes are matched by their words only: the message names
// the registry, whose port (127.0.0.1:40185) may hold the digits.
func pullFailureKind(err error) string {
	msg := strings.ToLower(err.Error())
	for _, s := range []string{"unauthorized", "access denied", "authorization failed", "no basic auth credentials", "forbidden", "denied:"} {
		if strings.Contains(msg, s) {
			return pullUnauthorized
		}
	}
	for _, s := range []string{": not found", "manifest unknown", "404 not found", "name unknown"} {
		if strings.Contains(msg, s) {
			return pullNotFound
		}
	}
	return pullFailed
}

// pullVerdict is what a held stop whose pull failed gets.
type pullVerdict struct {
	// pass: kubelet's stop goes ahead (kubelet pulls itself); else it is
	// refused and the old container keeps running.
	pass bool
	kind string
	// why is the case; todo what to do about it.
	why, todo string
}

// decidePullFailure keeps both promises: a tag nobody can pull never takes
// the pod down (kubelet's stop is refused and the old container runs on),
// and an image kubelet can pull always lands. The line between the two is
// whether kubelet could have credentials inplaced did not: when the
// registry refused the pull and inplaced could not read every source
// kubelet reads (a pull secret it may not read, a failed plugin, a
// service-account-token plugin), kubelet's stop goes ahead so that
// kubelet's own pull runs. With every source read, kubelet would send the
// registry the same credentials (or none) and be refused the same way.
func decidePullFailure(policy string, kind string, l lookup) pullVerdict {
	v := pullVerdict{kind: kind}
	switch {
	case policy == PassThrough:
		v.pass = true
		v.why = "--on-pull-failure=pass-through"
		v.todo = "kubelet's stop goes ahead; kubelet pulls the image itself"
	case kind == pullUnauthorized && !l.complete:
		v.pass = true
		v.why = "the registry refused the pull, and kubelet may hold credentials inplaced could not get (" + l.describe + ")"
		v.todo = "kubelet's stop goes ahead so that kubelet pulls with its own credentials"
	case kind == pullUnauthorized:
		v.why = "the registry refused the pull with the credentials kubelet would use too (" + l.describe + ")"
		v.todo = "add or fix an imagePullSecret of the pod, or the node's credentials, for " + l.repo +
			", or set the image back; inplaced pulls again on kubelet's next attempt. If kubelet has credentials inplaced is not given, " +
			"give inplaced kubelet's --root-dir (--kubelet-root-dir), --image-credential-provider-config and --image-credential-provider-bin-dir"
	case kind == pullNotFound:
		v.why = "the registry has no such image (" + l.describe + ")"
		v.todo = "fix the image reference or set the image back; inplaced pulls again on kubelet's next attempt"
	default:
		v.why = "the pull failed (" + l.describe + ")"
		v.todo = "fix the image reference or the pod's imagePullSecrets, or set the image back; inplaced pulls again on kubelet's next attempt"
	}
	return v
}

// outcome is the verdict's effect in words, for the record and logs.
func (v pullVerdict) outcome() string {
	if v.pass {
		return "kubelet's stop goes ahead"
	}
	return "kubelet's stop refused, the old container keeps running"
}

// explainPull is the swap's ExplainPull for a change: the record and its
// Event say which case the failure was and what happens next.
func (ic *imageChanges) explainPull(l lookup) func(error) error {
	return func(err error) error {
		v := decidePullFailure(ic.onPullFailure, pullFailureKind(err), l)
		return fmt.Errorf("%s: %s; %s: %w", v.kind, v.why, v.outcome(), err)
	}
}

// newCredentials is the default resolver when Options has none: the
// node's docker config in kubelet's default root dir, no plugins.
func newCredentials() *credentials.Resolver {
	r, _ := credentials.New(credentials.Options{KubeletRootDir: "/var/lib/kubelet"})
	return r
}
