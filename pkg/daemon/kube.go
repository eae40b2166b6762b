package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"k8s.io/client-go/tools/clientcmd"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/config"
	"github.com/inplaced/inplaced/pkg/credentials"
	"github.com/inplaced/inplaced/pkg/errkind"
	"github.com/inplaced/inplaced/pkg/health"
	"github.com/inplaced/inplaced/pkg/intercept"
	"github.com/inplaced/inplaced/pkg/kube"
	"github.com/inplaced/inplaced/pkg/kubeclient"
	"github.com/inplaced/inplaced/pkg/kubeletview"
	"github.com/inplaced/inplaced/pkg/store"
	"github.com/inplaced/inplaced/pkg/swap"
	"github.com/inplaced/inplaced/pkg/version"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// kubeconfigPoll is how often a kubeconfig that cannot be used yet is read
// again (on k3s the file is written by k3s itself, once it runs — after it
// found the CRI socket inplaced serves).
const kubeconfigPoll = 2 * time.Second

// kubeSlot is Kubernetes mode as the rest of the daemon sees it from the
// start: empty (every call does what node-local mode does) until the
// kubeconfig can be used and the controller is made.
type kubeSlot struct {
	kubeconfig string
	kc         atomic.Pointer[kube.Controller]
}

// SwapInsteadOfStop implements intercept.StopHolder.
func (s *kubeSlot) SwapInsteadOfStop(ctx context.Context, req *runtimeapi.StopContainerRequest) (intercept.StopDecision, error) {
	if kc := s.kc.Load(); kc != nil {
		return kc.SwapInsteadOfStop(ctx, req)
	}
	return intercept.StopDecision{}, nil
}

// Report is the engine's swap news.
func (s *kubeSlot) Report(n swap.SwapNews) {
	if kc := s.kc.Load(); kc != nil {
		kc.Report(n)
	}
}

// Admit is the Kubernetes part of the swap admission.
func (s *kubeSlot) Admit(ctx context.Context, namespace, pod, uid string) (string, error) {
	if kc := s.kc.Load(); kc != nil {
		return kc.Admit(ctx, namespace, pod, uid)
	}
	return "", nil
}

// Misfits implements control.PodChecker.
func (s *kubeSlot) Misfits() (string, int, []*inplacedv1.PodFit, error) {
	if kc := s.kc.Load(); kc != nil {
		return kc.Misfits()
	}
	return "", 0, nil, errkind.Errorf(errkind.Refused, "Kubernetes mode has not started: --kubeconfig %s cannot be used yet (inplacectl status says why)", s.kubeconfig)
}

// NodeEvent writes an event about the node once Kubernetes mode runs.
func (s *kubeSlot) NodeEvent(typ, reason, message string) {
	if kc := s.kc.Load(); kc != nil {
		kc.NodeEvent(typ, reason, message)
	}
}

// mode is the status of Kubernetes mode: off, waiting or on.
func (s *kubeSlot) mode() string {
	switch {
	case s.kubeconfig == "":
		return "off"
	case s.kc.Load() == nil:
		return "waiting"
	}
	return "on"
}

// kubeDeps is what the controller is made of.
type kubeDeps struct {
	cfg    config.Config
	engine *swap.Engine
	view   *kubeletview.View
	rt     runtimeapi.RuntimeServiceClient
	st     *store.Store
	board  *health.Board
	log    *zap.Logger
	// started is called once the controller is in the slot.
	started func()
}

// runKube makes the controller as soon as the kubeconfig can be used —
// saying meanwhile why it cannot — and runs it until ctx ends. CRI is
// served all along.
func (s *kubeSlot) run(ctx context.Context, d kubeDeps) {
	for {
		kc, err := newKubeController(d)
		if err == nil {
			d.board.Clear(health.PartKubeconfig)
			d.board.Clear(health.PartCredentials)
			s.kc.Store(kc)
			if d.started != nil {
				d.started()
			}
			if err := kc.Run(ctx); err != nil {
				d.log.Error("Kubernetes mode stopped: node-local mode only until restart", zap.Error(err))
			}
			return
		}
		p := notStartedProblem(d.cfg, err)
		if p.Part == health.PartCredentials {
			d.board.Clear(health.PartKubeconfig) // it was read: the credentials come after it
		}
		d.board.Set(p)
		select {
		case <-ctx.Done():
			return
		case <-time.After(kubeconfigPoll):
		}
	}
}

// credentialsError is a credential-provider configuration that cannot be
// used: the operator mends that file, not the kubeconfig.
type credentialsError struct{ error }

func (e credentialsError) Unwrap() error { return e.error }

// notStartedProblem is what the health board says while Kubernetes mode
// cannot start because of err: the part at fault and what to do about it.
func notStartedProblem(cfg config.Config, err error) health.Problem {
	if errors.As(err, new(credentialsError)) {
		return health.Problem{Part: health.PartCredentials, What: err.Error(),
			Action: fmt.Sprintf("mend --image-credential-provider-config %s (the file kubelet uses; see docs/credentials.md); inplaced reads it again every %s "+
				"and starts Kubernetes mode then; until then it works as in node-local mode", cfg.ImageCredentialProviderConfig, kubeconfigPoll)}
	}
	return health.Problem{Part: health.PartKubeconfig, What: err.Error(),
		Action: fmt.Sprintf("write a usable kubeconfig at %s (k3s and kubeadm write theirs once the node runs); inplaced reads it every %s "+
			"and starts Kubernetes mode then; until then it works as in node-local mode", cfg.Kubeconfig, kubeconfigPoll)}
}

// newKubeController returns the Kubernetes mode controller, or why the
// kubeconfig cannot be used yet.
func newKubeController(d kubeDeps) (*kube.Controller, error) {
	cfg := d.cfg
	node, err := cfg.EffectiveNodeName()
	if err != nil {
		return nil, err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	if rc.Host == "" {
		// A file still being written parses to an empty config.
		return nil, fmt.Errorf("--kubeconfig %s: %w", cfg.Kubeconfig, errors.New("no API server in it"))
	}
	rc.UserAgent = "inplaced/" + version.Version
	client, err := kubeclient.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	d.log.Info("Kubernetes mode", zap.String("kubeconfig", cfg.Kubeconfig), zap.String("api_server", rc.Host), zap.String("node", node),
		zap.String("on_pull_failure", cfg.OnPullFailure), zap.String("kubelet_root_dir", cfg.KubeletRootDir),
		zap.String("image_credential_provider_config", cfg.ImageCredentialProviderConfig))
	creds, err := credentials.New(credentials.Options{KubeletRootDir: cfg.KubeletRootDir,
		ProviderConfig: cfg.ImageCredentialProviderConfig, ProviderBinDir: cfg.ImageCredentialProviderBinDir, Logger: d.log.Named("credentials")})
	if err != nil {
		return nil, credentialsError{err}
	}
	return kube.New(kube.Options{Client: client, NodeName: node, Engine: d.engine, Kubelet: d.view, Runtime: d.rt, Store: d.st,
		Logger: d.log, OnPullFailure: cfg.OnPullFailure, AffinityDrift: cfg.AffinityDrift, Credentials: creds})
}
