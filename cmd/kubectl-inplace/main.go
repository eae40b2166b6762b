// Command kubectl-inplace is a kubectl plugin (`kubectl inplace`): it asks
// inplaced for in-place swaps through the pod API — the inplaced.io/swap
// annotation — and follows the inplaced.io/swap-status annotation that the
// inplaced on the pod's node writes back (pkg/kube/podapi is that contract).
// Nothing here talks to a node: it needs only a kubeconfig that may get,
// watch and patch pods.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/inplaced/inplaced/pkg/kubeclient"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := newRoot().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubectl-inplace:", err)
		os.Exit(1)
	}
}

// globals are the kubeconfig flags every command shares, resolved as
// kubectl resolves them: --kubeconfig, else $KUBECONFIG, else
// ~/.kube/config; --context, -n/--namespace and the other overrides.
type globals struct {
	loading   *clientcmd.ClientConfigLoadingRules
	overrides *clientcmd.ConfigOverrides
}

func newRoot() *cobra.Command {
	g := &globals{loading: clientcmd.NewDefaultClientConfigLoadingRules(), overrides: &clientcmd.ConfigOverrides{}}
	root := &cobra.Command{
		Use:   "kubectl-inplace",
		Short: "Swap containers in place through inplaced, from the Kubernetes API",
		Long: `kubectl inplace asks the inplaced on a pod's node to swap one of its containers in
place (image, env, command, args) by writing the pod annotation inplaced.io/swap, and
follows the inplaced.io/swap-status annotation inplaced writes back.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Annotations: map[string]string{
			cobra.CommandDisplayNameAnnotation: "kubectl inplace",
		},
	}
	f := root.PersistentFlags()
	f.StringVar(&g.loading.ExplicitPath, clientcmd.RecommendedConfigPathFlag, "", "path to the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
	clientcmd.BindOverrideFlags(g.overrides, f, clientcmd.RecommendedConfigOverrideFlags(""))
	root.AddCommand(newSwapCommand(g), newStatusCommand(g))
	return root
}

// Client is what the plugin asks of the API server: pods, got, listed,
// watched and patched. pkg/kubeclient's core/v1 client makes the requests
// client-go's full clientset makes, without linking every API group's
// types and clients (deps_test.go).
type Client interface {
	Pods(namespace string) kubeclient.PodInterface
}

// client returns a core/v1 client and the namespace the flags or the
// kubeconfig context name.
func (g *globals) client() (Client, string, error) {
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(g.loading, g.overrides)
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, "", fmt.Errorf("namespace: %w", err)
	}
	rc, err := cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	rc.UserAgent = "kubectl-inplace"
	c, err := kubeclient.NewForConfig(rc)
	if err != nil {
		return nil, "", err
	}
	return c, ns, nil
}
