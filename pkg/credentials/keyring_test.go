// Copyright 2014 The Kubernetes Authors.
// Copyright 2026 The inplaced Authors.
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
//     http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

// kubelet's keyring test vectors, ported from k8s.io/kubernetes v1.37.2
// pkg/credentialprovider/keyring_test.go: the same cases (the set-up of
// the one-entry keyrings shared by keyringWith), with the credential's
// source in place of kubelet's tracking hash.

package credentials

import (
	"encoding/base64"
	"fmt"
	"reflect"
	"testing"
)

func TestURLsMatch(t *testing.T) {
	tests := []struct {
		globURL       string
		targetURL     string
		matchExpected bool
	}{
		// match when there is no path component
		{
			globURL:       "*.kubernetes.io",
			targetURL:     "prefix.kubernetes.io",
			matchExpected: true,
		},
		{
			globURL:       "prefix.*.io",
			targetURL:     "prefix.kubernetes.io",
			matchExpected: true,
		},
		{
			globURL:       "prefix.kubernetes.*",
			targetURL:     "prefix.kubernetes.io",
			matchExpected: true,
		},
		{
			globURL:       "*-good.kubernetes.io",
			targetURL:     "prefix-good.kubernetes.io",
			matchExpected: true,
		},
		// match with path components
		{
			globURL:       "*.kubernetes.io/blah",
			targetURL:     "prefix.kubernetes.io/blah",
			matchExpected: true,
		},
		{
			globURL:       "prefix.*.io/foo",
			targetURL:     "prefix.kubernetes.io/foo/bar",
			matchExpected: true,
		},
		// match with path components and ports
		{
			globURL:       "*.kubernetes.io:1111/blah",
			targetURL:     "prefix.kubernetes.io:1111/blah",
			matchExpected: true,
		},
		{
			globURL:       "prefix.*.io:1111/foo",
			targetURL:     "prefix.kubernetes.io:1111/foo/bar",
			matchExpected: true,
		},
		// no match when number of parts mismatch
		{
			globURL:       "*.kubernetes.io",
			targetURL:     "kubernetes.io",
			matchExpected: false,
		},
		{
			globURL:       "*.*.kubernetes.io",
			targetURL:     "prefix.kubernetes.io",
			matchExpected: false,
		},
		{
			globURL:       "*.*.kubernetes.io",
			targetURL:     "kubernetes.io",
			matchExpected: false,
		},
		{
			globURL:       "*kubernetes.io",
			targetURL:     "a.kubernetes.io",
			matchExpected: false,
		},
		// match when number of parts match
		{
			globURL:       "*kubernetes.io",
			targetURL:     "kubernetes.io",
			matchExpected: true,
		},
		{
			globURL:       "*.*.*.kubernetes.io",
			targetURL:     "a.b.c.kubernetes.io",
			matchExpected: true,
		},
		// no match when some parts mismatch
		{
			globURL:       "kubernetes.io",
			targetURL:     "kubernetes.com",
			matchExpected: false,
		},
		{
			globURL:       "k*.io",
			targetURL:     "quay.io",
			matchExpected: false,
		},
		// no match when ports mismatch
		{
			globURL:       "*.kubernetes.io:1234/blah",
			targetURL:     "prefix.kubernetes.io:1111/blah",
			matchExpected: false,
		},
		{
			globURL:       "prefix.*.io/foo",
			targetURL:     "prefix.kubernetes.io:1111/foo/bar",
			matchExpected: false,
		},
	}
	for _, test := range tests {
		matched, _ := URLsMatchStr(test.globURL, test.targetURL)
		if matched != test.matchExpected {
			t.Errorf("Expected match result of %s and %s to be %t, but was %t",
				test.globURL, test.targetURL, test.matchExpected, matched)
		}
	}
}

// keyringWith is a keyring of one docker config entry for key, with
// kubelet's test user foo/bar (an "auth" field) and email.
func keyringWith(t *testing.T, key string) *Keyring {
	t.Helper()
	auth := base64.StdEncoding.EncodeToString([]byte(fmt.Sprintf("%s:%s", testUser.Username, testUser.Password)))
	sampleDockerConfig := fmt.Sprintf(`{
   "%s": {
     "email": %q,
     "auth": %q
   }
}`, key, testUser.Email, auth)
	keyring := &Keyring{}
	cfg, err := readDockerConfigFileFromBytes([]byte(sampleDockerConfig))
	if err != nil {
		t.Fatalf("Error processing json blob %q, %v", sampleDockerConfig, err)
	}
	keyring.Add("test", cfg)
	return keyring
}

var testUser = Credential{Username: "foo", Password: "bar", Email: "foo@bar.baz"} // Fake values for testing.

// wantTestUser checks a lookup's first credential is testUser.
func wantTestUser(t *testing.T, what string, creds []Credential, ok bool, most int) {
	t.Helper()
	if !ok || len(creds) == 0 {
		t.Errorf("%s: didn't find the expected credential", what)
		return
	}
	if len(creds) > most {
		t.Errorf("%s: got more hits than expected: %v", what, creds)
	}
	if val := creds[0]; val.Username != testUser.Username || val.Password != testUser.Password || val.Email != testUser.Email {
		t.Errorf("%s: unexpected credential %+v", what, val)
	}
}

func TestDockerKeyringForGlob(t *testing.T) {
	tests := []struct {
		globURL   string
		targetURL string
	}{
		{globURL: "https://hello.kubernetes.io", targetURL: "hello.kubernetes.io"},
		{globURL: "https://*.docker.io", targetURL: "prefix.docker.io"},
		{globURL: "https://prefix.*.io", targetURL: "prefix.docker.io"},
		{globURL: "https://prefix.docker.*", targetURL: "prefix.docker.io"},
		{globURL: "https://*.docker.io/path", targetURL: "prefix.docker.io/path"},
		{globURL: "https://prefix.*.io/path", targetURL: "prefix.docker.io/path/subpath"},
		{globURL: "https://prefix.docker.*/path", targetURL: "prefix.docker.io/path"},
		{globURL: "https://*.docker.io:8888", targetURL: "prefix.docker.io:8888"},
		{globURL: "https://prefix.*.io:8888", targetURL: "prefix.docker.io:8888"},
		{globURL: "https://prefix.docker.*:8888", targetURL: "prefix.docker.io:8888"},
		{globURL: "https://*.docker.io/path:1111", targetURL: "prefix.docker.io/path:1111"},
		{globURL: "https://*.docker.io/v1/", targetURL: "prefix.docker.io/path:1111"},
		{globURL: "https://*.docker.io/v2/", targetURL: "prefix.docker.io/path:1111"},
		{globURL: "https://prefix.docker.*/path:1111", targetURL: "prefix.docker.io/path:1111"},
		{globURL: "prefix.docker.io:1111", targetURL: "prefix.docker.io:1111/path"},
		{globURL: "*.docker.io:1111", targetURL: "prefix.docker.io:1111/path"},
	}
	for i, test := range tests {
		creds, ok := keyringWith(t, test.globURL).Lookup(test.targetURL + "/foo/bar")
		wantTestUser(t, fmt.Sprintf("%d: %s", i, test.targetURL), creds, ok, len(creds))
	}
}

func TestKeyringMiss(t *testing.T) {
	tests := []struct {
		globURL   string
		lookupURL string
	}{
		{globURL: "https://hello.kubernetes.io", lookupURL: "world.mesos.org/foo/bar"},
		{globURL: "https://*.docker.com", lookupURL: "prefix.docker.io"},
		{globURL: "https://suffix.*.io", lookupURL: "prefix.docker.io"},
		{globURL: "https://prefix.docker.c*", lookupURL: "prefix.docker.io"},
		{globURL: "https://prefix.*.io/path:1111", lookupURL: "prefix.docker.io/path/subpath:1111"},
		{globURL: "suffix.*.io", lookupURL: "prefix.docker.io"},
	}
	for _, test := range tests {
		if _, ok := keyringWith(t, test.globURL).Lookup(test.lookupURL + "/foo/bar"); ok {
			t.Errorf("Expected not to find URL %s, but found", test.lookupURL)
		}
	}
}

func TestKeyringMissWithDockerHubCredentials(t *testing.T) {
	if val, ok := keyringWith(t, "https://"+defaultRegistryHost+"/v1/").Lookup("world.mesos.org/foo/bar"); ok {
		t.Errorf("Found unexpected credential: %+v", val)
	}
}

func TestKeyringHitWithUnqualifiedDockerHub(t *testing.T) {
	creds, ok := keyringWith(t, "https://"+defaultRegistryHost+"/v1/").Lookup("google/docker-registry")
	wantTestUser(t, "google/docker-registry", creds, ok, 1)
}

func TestKeyringHitWithUnqualifiedLibraryDockerHub(t *testing.T) {
	creds, ok := keyringWith(t, "https://"+defaultRegistryHost+"/v1/").Lookup("jenkins")
	wantTestUser(t, "jenkins", creds, ok, 1)
}

func TestKeyringHitWithQualifiedDockerHub(t *testing.T) {
	url := defaultRegistryHost + "/v1/"
	creds, ok := keyringWith(t, "https://"+url).Lookup(url + "/google/docker-registry")
	wantTestUser(t, url+"/google/docker-registry", creds, ok, 2)
}

func TestIsDefaultRegistryMatch(t *testing.T) {
	samples := []map[bool]string{
		{true: "foo/bar"},
		{true: "docker.io/foo/bar"},
		{true: "index.docker.io/foo/bar"},
		{true: "foo"},
		{false: ""},
		{false: "registry.tld/foo/bar"},
		{false: "registry:5000/foo/bar"},
		{false: "myhostdocker.io/foo/bar"},
	}
	for _, sample := range samples {
		for expected, imageName := range sample {
			if got := isDefaultRegistryMatch(imageName); got != expected {
				t.Errorf("Expected '%s' to be %t, got %t", imageName, expected, got)
			}
		}
	}
}

func TestDockerKeyringLookup(t *testing.T) {
	ada := Credential{Username: "ada", Password: "smash", Email: "ada@example.com", Source: "test key bar.example.com"}
	grace := Credential{Username: "grace", Password: "squash", Email: "grace@example.com", Source: "test key bar.example.com/pong"}

	dk := &Keyring{}
	dk.Add("test", DockerConfig{
		"bar.example.com/pong": DockerConfigEntry{Username: grace.Username, Password: grace.Password, Email: grace.Email},
		"bar.example.com":      DockerConfigEntry{Username: ada.Username, Password: ada.Password, Email: ada.Email},
	})

	tests := []lookupCase{
		// direct match
		{"bar.example.com", []Credential{ada}, true},
		// direct match deeper than other possible matches
		{"bar.example.com/pong", []Credential{grace, ada}, true},
		// no direct match, deeper path ignored
		{"bar.example.com/ping", []Credential{ada}, true},
		// match first part of path token
		{"bar.example.com/pongz", []Credential{grace, ada}, true},
		// match regardless of sub-path
		{"bar.example.com/pong/pang", []Credential{grace, ada}, true},
		// no host match
		{"example.com", nil, false},
		{"foo.example.com", nil, false},
	}
	checkLookups(t, dk, tests)
}

// This validates that dockercfg entries with a scheme and url path are properly matched
// by images that only match the hostname.
// NOTE: the above covers the case of a more specific match trumping just hostname.
func TestIssue3797(t *testing.T) {
	rex := Credential{Username: "rex", Password: "tiny arms", Email: "rex@example.com", Source: "test key quay.io"}

	dk := &Keyring{}
	dk.Add("test", DockerConfig{
		"https://quay.io/v1/": DockerConfigEntry{Username: rex.Username, Password: rex.Password, Email: rex.Email},
	})

	tests := []lookupCase{
		// direct match
		{"quay.io", []Credential{rex}, true},
		// partial matches
		{"quay.io/foo", []Credential{rex}, true},
		{"quay.io/foo/bar", []Credential{rex}, true},
	}
	checkLookups(t, dk, tests)
}

type lookupCase struct {
	image string
	match []Credential
	ok    bool
}

func checkLookups(t *testing.T, dk *Keyring, tests []lookupCase) {
	t.Helper()
	for i, tt := range tests {
		match, ok := dk.Lookup(tt.image)
		if tt.ok != ok {
			t.Errorf("case %d: expected ok=%t, got %t", i, tt.ok, ok)
		}
		if !reflect.DeepEqual(tt.match, match) {
			t.Errorf("case %d: expected match=%#v, got %#v", i, tt.match, match)
		}
	}
}
