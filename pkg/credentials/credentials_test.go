package credentials

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func dockerSecret(name string, auths map[string][2]string) *corev1.Secret {
	cfg := map[string]map[string]string{}
	for k, up := range auths {
		cfg[k] = map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte(up[0] + ":" + up[1]))}
	}
	b, _ := json.Marshal(map[string]any{"auths": cfg})
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: b}}
}

// plugin writes a credential-provider script answering with user:pass for
// its registry; it appends each request to dir/requests.
func plugin(t *testing.T, dir, name, answer string) {
	t.Helper()
	script := "#!/bin/sh\ncat >> " + filepath.Join(dir, "requests") + "\necho >> " + filepath.Join(dir, "requests") + "\ncat <<'EOF'\n" + answer + "\nEOF\n"
	if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}

func writeConfig(t *testing.T, dir, body string) string {
	t.Helper()
	p := filepath.Join(dir, "providers.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func users(cs []Credential) string {
	var u []string
	for _, c := range cs {
		u = append(u, c.Username)
	}
	return strings.Join(u, ",")
}

const providerYAML = `apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
- name: test-plugin
  apiVersion: credentialprovider.kubelet.k8s.io/v1
  matchImages: ["*.example.com", "reg.example.com:5000/plug"]
  defaultCacheDuration: 10m
  args: ["--x"]
  env: [{name: TEST_ENV, value: v}]
`

func TestLookupKubeletOrder(t *testing.T) {
	root, bin := t.TempDir(), t.TempDir()
	node := `{"auths":{"reg.example.com:5000":{"auth":"` + base64.StdEncoding.EncodeToString([]byte("node:pw")) + `"}}}`
	if err := os.WriteFile(filepath.Join(root, "config.json"), []byte(node), 0o600); err != nil {
		t.Fatal(err)
	}
	plugin(t, bin, "test-plugin", `{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","cacheKeyType":"Registry","auth":{"reg.example.com:5000":{"username":"plug","password":"pw"}}}`)
	r, err := New(Options{KubeletRootDir: root, ProviderConfig: writeConfig(t, bin, providerYAML), ProviderBinDir: bin})
	if err != nil {
		t.Fatal(err)
	}
	secrets := []*corev1.Secret{
		dockerSecret("a", map[string][2]string{"reg.example.com:5000": {"host", "pw"}, "reg.example.com:5000/other": {"other", "pw"}}),
		dockerSecret("b", map[string][2]string{"https://reg.example.com:5000/team": {"team", "pw"}}),
	}
	res, err := r.Lookup(context.Background(), Request{Image: "reg.example.com:5000/team/app:v2", Secrets: secrets, Missing: []string{"ns/gone"}})
	if err != nil {
		t.Fatal(err)
	}
	// Secrets (most specific key first, the key of another path left
	// out), then the node's config, then the plugin (not matched:
	// matchImages has no port for *.example.com, and /plug is another path).
	if got := users(res.Credentials); got != "team,host,node" {
		t.Errorf("credentials %q, want team,host,node", got)
	}
	if !res.Complete() {
		t.Errorf("gaps %v, want none (a missing secret is skipped by kubelet too)", res.Gaps)
	}
	res, _ = r.Lookup(context.Background(), Request{Image: "reg.example.com:5000/plug/app"})
	if got := users(res.Credentials); got != "node,plug" {
		t.Errorf("credentials %q, want node,plug", got)
	}
	d := res.Describe("reg.example.com:5000/plug/app")
	if strings.Contains(d, "pw") || !strings.Contains(d, `credential provider "test-plugin" key reg.example.com:5000`) {
		t.Errorf("Describe = %q: want sources, never passwords", d)
	}
}

func TestPluginRequestAndCache(t *testing.T) {
	bin := t.TempDir()
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	plugin(t, bin, "test-plugin", `{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","cacheKeyType":"Registry","cacheDuration":"30s","auth":{"reg.example.com:5000":{"username":"plug","password":"pw"}}}`)
	r, err := New(Options{ProviderConfig: writeConfig(t, bin, providerYAML), ProviderBinDir: bin, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	lookup := func(image string) {
		t.Helper()
		res, err := r.Lookup(context.Background(), Request{Image: image})
		if err != nil || users(res.Credentials) != "plug" || !res.Complete() {
			t.Fatalf("lookup %s: %v %+v", image, err, res)
		}
	}
	calls := func() []string {
		b, _ := os.ReadFile(filepath.Join(bin, "requests"))
		return strings.Fields(string(b))
	}
	lookup("reg.example.com:5000/plug/a:v1")
	lookup("reg.example.com:5000/plug/b:v1") // same registry: cached
	if c := calls(); len(c) != 1 || c[0] != `{"kind":"CredentialProviderRequest","apiVersion":"credentialprovider.kubelet.k8s.io/v1","image":"reg.example.com:5000/plug/a"}` {
		t.Fatalf("plugin requests %q: want kubelet's one request for the repository", c)
	}
	now = now.Add(31 * time.Second)
	lookup("reg.example.com:5000/plug/a:v1")
	if c := calls(); len(c) != 2 {
		t.Fatalf("after the answer's 30s: %d plugin calls, want 2", len(c))
	}
}

func TestPluginFailureAndTokensAreGaps(t *testing.T) {
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "test-plugin"), []byte("#!/bin/sh\necho boom >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "sa-plugin"), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := providerYAML + `- name: sa-plugin
  apiVersion: credentialprovider.kubelet.k8s.io/v1
  matchImages: ["reg.example.com:5000"]
  defaultCacheDuration: 0s
  tokenAttributes: {serviceAccountTokenAudience: reg, requireServiceAccount: false, cacheType: ServiceAccount}
`
	r, err := New(Options{ProviderConfig: writeConfig(t, bin, cfg), ProviderBinDir: bin})
	if err != nil {
		t.Fatal(err)
	}
	res, _ := r.Lookup(context.Background(), Request{Image: "reg.example.com:5000/plug/a", Unreadable: []string{"pull secret ns/x: forbidden"}})
	if res.Complete() || len(res.Gaps) != 3 {
		t.Fatalf("gaps %q: want the unreadable secret, the failed plugin and the token plugin", res.Gaps)
	}
	if !strings.Contains(res.Gaps[1], "boom") || !strings.Contains(res.Gaps[2], "service-account token") {
		t.Errorf("gaps %q: want the plugin's stderr and the token mode named", res.Gaps)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	bin := t.TempDir()
	for name, tc := range map[string]struct{ cfg, want string }{
		"kind":     {"apiVersion: v1\nkind: Pod\n", "want kind CredentialProviderConfig"},
		"unknown":  {"apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders: []\nextra: 1\n", "unknown field"},
		"empty":    {"apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders: []\n", "at least 1"},
		"fields":   {"apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders: [{name: a/b, apiVersion: x}]\n", "matchImages"},
		"noplugin": {strings.Replace(providerYAML, "test-plugin", "absent", 1), "plugin executable"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := New(Options{ProviderConfig: writeConfig(t, bin, tc.cfg), ProviderBinDir: bin})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error with %q", err, tc.want)
			}
		})
	}
	if _, err := New(Options{ProviderConfig: "/x"}); err == nil {
		t.Fatal("config without bin dir accepted")
	}
}

func TestNodeConfigOrder(t *testing.T) {
	root := t.TempDir()
	legacy := `{"reg.example.com":{"auth":"` + base64.StdEncoding.EncodeToString([]byte("legacy:pw")) + `"}}`
	if err := os.WriteFile(filepath.Join(root, ".dockercfg"), []byte(legacy), 0o600); err != nil {
		t.Fatal(err)
	}
	r, _ := New(Options{KubeletRootDir: root})
	res, _ := r.Lookup(context.Background(), Request{Image: "reg.example.com/a"})
	// A config.json in ~/.docker or /.docker of this machine would win
	// over the root dir's .dockercfg, as in kubelet.
	if _, from, _ := readNodeConfig(root); strings.HasSuffix(from, ".dockercfg") && users(res.Credentials) != "legacy" {
		t.Fatalf("credentials %q from %s, want legacy", users(res.Credentials), from)
	}
	if err := os.WriteFile(filepath.Join(root, "config.json"), []byte(`{"auths":{"reg.example.com":{"username":"json","password":"pw"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	res, _ = r.Lookup(context.Background(), Request{Image: "reg.example.com/a"})
	if users(res.Credentials) != "json" {
		t.Fatalf("credentials %q, want the root dir's config.json first", users(res.Credentials))
	}
}
