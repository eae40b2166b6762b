package swap

import (
	"os/exec"
	"strings"
	"testing"
)

// The engine sees a connection hold only through Holder and the mode
// vocabulary of package holdmode, and the overlap's socket takeover only
// through Taker: package hold (nftables, netlink, NFQUEUE) and package
// takeover (seccomp notify, pidfd) stay out of it, so that the engine is tested with a fake and
// links no netlink code.
func TestEngineLinksNoNetlink(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("no go command to list the dependencies: %v", err)
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	var vocabulary bool
	for _, pkg := range strings.Fields(string(out)) {
		for _, bad := range []string{"github.com/inplaced/inplaced/pkg/hold", "github.com/google/nftables", "github.com/mdlayher/netlink"} {
			if pkg == bad || strings.HasPrefix(pkg, bad+"/") {
				t.Errorf("pkg/swap links %s: reach the connection hold through Holder (package daemon wires package hold in)", pkg)
			}
		}
		if bad := "github.com/inplaced/inplaced/pkg/takeover"; pkg == bad || strings.HasPrefix(pkg, bad+"/") {
			t.Errorf("pkg/swap links %s: reach the socket takeover through Taker (package daemon wires package takeover in)", pkg)
		}
		vocabulary = vocabulary || pkg == "github.com/inplaced/inplaced/pkg/holdmode"
	}
	if !vocabulary {
		t.Error("pkg/holdmode not among pkg/swap's dependencies: is the list right?")
	}
}
