package kube

import (
	"encoding/base64"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func secret(name string, typ corev1.SecretType, key, body string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Type: typ,
		Data: map[string][]byte{key: []byte(body)}}
}

func TestAuthsFor(t *testing.T) {
	auth := base64.StdEncoding.EncodeToString([]byte("bob:s3cret"))
	secrets := []*corev1.Secret{
		secret("hub", corev1.SecretTypeDockerConfigJson, corev1.DockerConfigJsonKey,
			`{"auths":{"https://index.docker.io/v1/":{"auth":"`+auth+`"}}}`),
		secret("local", corev1.SecretTypeDockerConfigJson, corev1.DockerConfigJsonKey,
			`{"auths":{"registry.local:5000":{"username":"u","password":"p"},"*.example.com":{"username":"w","password":"x"}}}`),
		secret("legacy", corev1.SecretTypeDockercfg, corev1.DockerConfigKey, `{"registry.local:5000":{"username":"old","password":"q"}}`),
		secret("broken", corev1.SecretTypeDockerConfigJson, corev1.DockerConfigJsonKey, `{`),
		secret("opaque", corev1.SecretTypeOpaque, "x", "y"),
	}
	cases := []struct {
		image string
		users []string
	}{
		{"nginx:1.27", []string{"bob"}},
		{"docker.io/library/nginx", []string{"bob"}},
		{"registry.local:5000/app:v2", []string{"u", "old"}},
		{"a.example.com/app", []string{"w"}},
		{"other.io/app", nil},
	}
	for _, c := range cases {
		auths, errs := AuthsFor(c.image, secrets)
		if len(errs) != 2 {
			t.Errorf("%s: %d errors (%v), want 2 (broken, opaque)", c.image, len(errs), errs)
		}
		var users []string
		for _, a := range auths {
			users = append(users, a.Username)
		}
		if len(users) != len(c.users) {
			t.Errorf("%s: users %v, want %v", c.image, users, c.users)
			continue
		}
		for i := range users {
			if users[i] != c.users[i] {
				t.Errorf("%s: users %v, want %v", c.image, users, c.users)
			}
		}
	}
	if a, _ := AuthsFor("nginx", secrets[:1]); len(a) != 1 || a[0].Password != "s3cret" || a[0].Auth != "" {
		t.Errorf("auth field not decoded: %+v", a)
	}
	if _, errs := AuthsFor("UPPER CASE", nil); len(errs) != 1 {
		t.Errorf("bad reference: %v", errs)
	}
}
