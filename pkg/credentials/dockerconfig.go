package credentials

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// maxConfigSize bounds a docker config file read (kubelet reads whole files;
// a node's config.json is a few kB).
const maxConfigSize = 10 << 20

// dockerConfigJSON is a config.json or a kubernetes.io/dockerconfigjson
// secret: {"auths": {...}}.
type dockerConfigJSON struct {
	Auths DockerConfig `json:"auths"`
}

// readDockerConfigFileFromBytes reads the legacy .dockercfg format (and a
// kubernetes.io/dockercfg secret): the auths map itself.
func readDockerConfigFileFromBytes(b []byte) (DockerConfig, error) {
	var cfg DockerConfig
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, errors.New("not a docker config: the JSON does not parse") // never echo the bytes
	}
	return cfg, nil
}

func readDockerConfigJSONFromBytes(b []byte) (DockerConfig, error) {
	var cfg dockerConfigJSON
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, errors.New("not a docker config.json: the JSON does not parse")
	}
	return cfg.Auths, nil
}

// nodeConfigPaths are the files kubelet reads the node's docker config
// from, in its order (k8s.io/kubernetes pkg/credentialprovider/config.go:
// DefaultDockerConfigJSONPaths then DefaultDockercfgPaths, with the
// preferred path set to kubelet's --root-dir): the first config.json that
// reads, else the first .dockercfg. The working directory and home are
// inplaced's own, which are kubelet's where both run as root under systemd
// (/ and /root).
func nodeConfigPaths(rootDir string) (configJSON, dockercfg []string) {
	home, _ := os.UserHomeDir()
	wd, _ := os.Getwd()
	configJSON = []string{
		filepath.Join(rootDir, "config.json"), filepath.Join(wd, "config.json"),
		filepath.Join(home, ".docker", "config.json"), filepath.Join("/", ".docker", "config.json"),
	}
	dockercfg = []string{
		filepath.Join(rootDir, ".dockercfg"), filepath.Join(wd, ".dockercfg"),
		filepath.Join(home, ".dockercfg"), filepath.Join("/", ".dockercfg"),
	}
	if rootDir == "" {
		configJSON, dockercfg = configJSON[1:], dockercfg[1:]
	}
	return configJSON, dockercfg
}

// readNodeConfig returns the node's docker config as kubelet finds it, and
// the file it came from ("" and no error when there is none). A file that
// exists but cannot be read or parsed is skipped, as kubelet skips it; the
// last such problem is returned with the config found after it, so that
// the caller can tell.
func readNodeConfig(rootDir string) (cfg DockerConfig, from string, skipped error) {
	configJSON, dockercfg := nodeConfigPaths(rootDir)
	for _, set := range []struct {
		paths []string
		parse func([]byte) (DockerConfig, error)
	}{{configJSON, readDockerConfigJSONFromBytes}, {dockercfg, readDockerConfigFileFromBytes}} {
		for _, p := range set.paths {
			b, err := readSmall(p)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err == nil {
				cfg, err = set.parse(b)
			}
			if err != nil {
				skipped = fmt.Errorf("%s: %w", p, err)
				continue
			}
			return cfg, p, skipped
		}
	}
	return nil, "", skipped
}

func readSmall(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.IsDir() {
		return nil, errors.New("is a directory")
	}
	if st.Size() > maxConfigSize {
		return nil, fmt.Errorf("larger than %d bytes", maxConfigSize)
	}
	return os.ReadFile(path)
}
