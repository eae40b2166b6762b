package swap

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/fence"
	"github.com/inplaced/inplaced/pkg/internal/fakecri"
	"github.com/inplaced/inplaced/pkg/kubeletview"
	"github.com/inplaced/inplaced/pkg/store"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// TestRegistryAuthNeverPersistedOrLogged: a swap's registry credentials are
// used for its pull and reach neither the logs (at debug level) nor the
// state file (journal, history, overrides).
func TestRegistryAuthNeverPersistedOrLogged(t *testing.T) {
	const secret = "s3cr3t-registry-pass"
	be := fakecri.Start(t)
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	eng, err := New(Options{Runtime: be.RuntimeClient, Images: be.ImageClient, Store: st, Fences: fence.NewRegistry(),
		Kubelet: kubeletview.New(), Logger: zap.New(core), HealthMinRuntime: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{be: be, st: st, eng: eng, pod: fakecri.PodConfig("default", "web", "uid-web")}
	resp, err := be.RuntimeClient.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: e.pod})
	if err != nil {
		t.Fatal(err)
	}
	e.sbID = resp.PodSandboxId
	if err := st.PutSandbox(e.sbID, &runtimeapi.RunPodSandboxRequest{Config: e.pod}); err != nil {
		t.Fatal(err)
	}
	e.create(t, e.containerReq(0), true)
	img := "registry.local/private:v2"
	sub, err := eng.Start(context.Background(), &inplacedv1.SwapRequest{
		Target: &inplacedv1.Target{Namespace: "default", Pod: "web", Container: "app"},
		Change: &inplacedv1.Change{Image: &img},
		Auth:   &inplacedv1.RegistryAuth{Username: "robot", Password: secret, ServerAddress: "registry.local"},
	}, Caller{}, Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	rec := (&events{t: t, sub: sub}).end()
	if rec.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED {
		t.Fatalf("swap: %s %s", rec.State, rec.Error)
	}
	eng.Wait()
	for _, l := range logs.All() {
		line := l.Message
		for _, f := range l.Context {
			line += " " + f.String + " " + f.Key
			if f.Interface != nil {
				line += " " + strings.TrimSpace(fmtAny(f.Interface))
			}
		}
		if strings.Contains(line, secret) {
			t.Fatalf("secret in log line: %s", line)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte(secret)) {
		t.Fatal("the registry password is in the state file")
	}
	if !bytes.Contains(raw, []byte(img)) {
		t.Fatal("the state file does not even contain the swap: the check above proves nothing")
	}
}
