package daemon

import (
	"fmt"

	"go.uber.org/zap"
	"k8s.io/client-go/tools/clientcmd"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/config"
	"github.com/inplaced/inplaced/pkg/kube"
	"github.com/inplaced/inplaced/pkg/kubeclient"
	"github.com/inplaced/inplaced/pkg/store"
	"github.com/inplaced/inplaced/pkg/swap"
	"github.com/inplaced/inplaced/pkg/version"
)

// newKubeController returns the Kubernetes mode controller, or nil when no
// kubeconfig is configured (node-local mode, exactly as without it).
func newKubeController(cfg config.Config, engine *swap.Engine, rt runtimeapi.RuntimeServiceClient, st *store.Store, log *zap.Logger) (*kube.Controller, error) {
	if cfg.Kubeconfig == "" {
		return nil, nil
	}
	node, err := cfg.EffectiveNodeName()
	if err != nil {
		return nil, err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	rc.UserAgent = "inplaced/" + version.Version
	client, err := kubeclient.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	log.Info("Kubernetes mode", zap.String("kubeconfig", cfg.Kubeconfig), zap.String("api_server", rc.Host), zap.String("node", node),
		zap.String("on_pull_failure", cfg.OnPullFailure))
	return kube.New(kube.Options{Client: client, NodeName: node, Engine: engine, Runtime: rt, Store: st,
		Logger: log, OnPullFailure: cfg.OnPullFailure, AffinityDrift: cfg.AffinityDrift})
}
