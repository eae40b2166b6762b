package control

import (
	"strings"
	"testing"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

func TestRedactRemovesSecrets(t *testing.T) {
	img := "registry.local/web:v2"
	req := &inplacedv1.SwapRequest{
		Target: &inplacedv1.Target{Namespace: "shop", Pod: "web", Container: "app"},
		Change: &inplacedv1.Change{Image: &img, SetEnv: map[string]string{"DB_PASSWORD": "hunter2"}},
		Auth:   &inplacedv1.RegistryAuth{Username: "bob", Password: "s3cret", ServerAddress: "registry.local"},
	}
	out := string(redact(req))
	for _, secret := range []string{"hunter2", "s3cret", "bob"} {
		if strings.Contains(out, secret) {
			t.Errorf("audit request %s contains %q", out, secret)
		}
	}
	for _, kept := range []string{"DB_PASSWORD", "registry.local/web:v2", "registry.local\"", "shop"} {
		if !strings.Contains(out, kept) {
			t.Errorf("audit request %s lacks %q", out, kept)
		}
	}
	if req.Auth.Password != "s3cret" {
		t.Fatal("redact changed the request itself")
	}
	pre := string(redact(&inplacedv1.PrepullRequest{Images: []string{"a"}, Auth: &inplacedv1.RegistryAuth{IdentityToken: "tok"}}))
	if strings.Contains(pre, "tok\"") {
		t.Errorf("prepull audit %s contains the token", pre)
	}
}
