package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/inplaced/inplaced/pkg/config"
	"github.com/inplaced/inplaced/pkg/health"
)

// A credential-provider config that cannot be used keeps Kubernetes mode
// waiting like a missing kubeconfig does, but the board names the file to
// mend: the kubeconfig is fine.
func TestNotStartedNamesThePartAtFault(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	providers := filepath.Join(dir, "providers.yaml")
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(kubeconfig, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`)
	write(providers, "this is not a CredentialProviderConfig\n")

	for _, tc := range []struct {
		name       string
		kubeconfig string
		providers  string
		part       health.Part
		action     string
	}{
		{"kubeconfig missing", filepath.Join(dir, "absent"), "", health.PartKubeconfig, "write a usable kubeconfig"},
		{"provider config bad", kubeconfig, providers, health.PartCredentials, "mend --image-credential-provider-config " + providers},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Config{Kubeconfig: tc.kubeconfig, NodeName: "n1", ImageCredentialProviderConfig: tc.providers,
				ImageCredentialProviderBinDir: dir, KubeletRootDir: dir}
			_, err := newKubeController(kubeDeps{cfg: cfg, log: zap.NewNop()})
			if err == nil {
				t.Fatal("Kubernetes mode started")
			}
			p := notStartedProblem(cfg, err)
			if p.Part != tc.part || !strings.Contains(p.Action, tc.action) || p.What == "" {
				t.Errorf("problem %+v (from %v): want part %s, action with %q", p, err, tc.part, tc.action)
			}
		})
	}
}
