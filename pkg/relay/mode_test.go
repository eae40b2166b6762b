package relay

import (
	"os"
	"os/exec"
	"testing"
)

// The package's tests run twice: as they are (the HTTP/2 router), and
// again, from TestThroughGRPCServer, with every call through grpc-go's
// server and client (WithGRPCServer, config relay: grpc), so that the
// fallback keeps passing what the router passes.
const modeEnv = "INPLACED_RELAY_TEST_MODE"

func grpcMode() bool { return os.Getenv(modeEnv) == "grpc" }

// modeOpts are the options of the mode the tests run in.
func modeOpts() []Option {
	if grpcMode() {
		return []Option{WithGRPCServer()}
	}
	return nil
}

// routerOnly skips a test of the router's own frame handling in grpc mode.
func routerOnly(t testing.TB, why string) {
	t.Helper()
	if grpcMode() {
		t.Skip("router only: " + why)
	}
}

// TestThroughGRPCServer runs every other test of the package again in grpc
// mode, in a child process of this test binary.
func TestThroughGRPCServer(t *testing.T) {
	if grpcMode() {
		t.Skip("this is the grpc-mode run")
	}
	args := []string{"-test.count=1", "-test.run", "^Test", "-test.skip", "^TestThroughGRPCServer$"}
	if testing.Verbose() {
		args = append(args, "-test.v")
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), modeEnv+"=grpc")
	out, err := cmd.CombinedOutput()
	t.Logf("grpc mode:\n%s", out)
	if err != nil {
		t.Fatalf("the tests failed in grpc mode: %v", err)
	}
}
