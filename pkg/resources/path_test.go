package resources

import (
	"errors"
	"testing"
)

func TestTargetCgroups(t *testing.T) {
	const uid, id = "0b8e6f4a_1c2d", "4f1a9c"
	for _, tc := range []struct {
		name           string
		target         Target
		container, pod string
	}{
		{
			"cgroupfs burstable",
			Target{CgroupsPath: "/kubepods/burstable/pod" + uid + "/" + id, Driver: DriverCgroupfs},
			"/kubepods/burstable/pod" + uid + "/" + id, "/kubepods/burstable/pod" + uid,
		},
		{
			"cgroupfs guessed",
			Target{CgroupsPath: "/kubepods/pod" + uid + "/" + id},
			"/kubepods/pod" + uid + "/" + id, "/kubepods/pod" + uid,
		},
		{
			"systemd burstable",
			Target{CgroupsPath: "kubepods-burstable-pod" + uid + ".slice:cri-containerd:" + id, Driver: DriverSystemd},
			"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uid + ".slice/cri-containerd-" + id + ".scope",
			"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uid + ".slice",
		},
		{
			"systemd guaranteed, guessed",
			Target{CgroupsPath: "kubepods-pod" + uid + ".slice:cri-containerd:" + id},
			"/kubepods.slice/kubepods-pod" + uid + ".slice/cri-containerd-" + id + ".scope",
			"/kubepods.slice/kubepods-pod" + uid + ".slice",
		},
		{
			"systemd crio prefix",
			Target{CgroupsPath: "kubepods-besteffort-pod" + uid + ".slice:crio:" + id, Driver: DriverSystemd},
			"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uid + ".slice/crio-" + id + ".scope",
			"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uid + ".slice",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctr, pod, err := tc.target.cgroups()
			if err != nil {
				t.Fatal(err)
			}
			if ctr != tc.container || pod != tc.pod {
				t.Errorf("cgroups() = %q, %q\nwant        %q, %q", ctr, pod, tc.container, tc.pod)
			}
		})
	}
}

func TestTargetCgroupsInvalid(t *testing.T) {
	for _, target := range []Target{
		{CgroupsPath: "kubepods/pod1/ctr", Driver: DriverCgroupfs},
		{CgroupsPath: "/kubepods/../../etc/ctr", Driver: DriverCgroupfs},
		{CgroupsPath: "/ctr", Driver: DriverCgroupfs},
		{CgroupsPath: "/kubepods/pod1/ctr", Driver: "docker"},
		{CgroupsPath: "kubepods--pod1.slice:cri-containerd:ctr", Driver: DriverSystemd},
		{CgroupsPath: "kubepods/pod1.slice:cri-containerd:ctr", Driver: DriverSystemd},
		{CgroupsPath: "kubepods-pod1:cri-containerd:ctr", Driver: DriverSystemd},
		{CgroupsPath: "kubepods-pod1.slice:ctr", Driver: DriverSystemd},
		{CgroupsPath: "kubepods-pod1.slice:cri-containerd:", Driver: DriverSystemd},
	} {
		if _, _, err := target.cgroups(); !errors.Is(err, ErrInvalidTarget) {
			t.Errorf("%+v: err = %v, want ErrInvalidTarget", target, err)
		}
	}
}

func TestTargetSandbox(t *testing.T) {
	for _, c := range []struct {
		in, ctr, pod string
	}{
		{"/kubepods/burstable/podU/abc", "/kubepods/burstable/podU", "/kubepods/burstable"},
		{"kubepods-burstable-podU.slice:cri-containerd:abc", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podU.slice", "/kubepods.slice/kubepods-burstable.slice"},
	} {
		s, err := Target{CgroupsPath: c.in}.Sandbox()
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		ctr, pod, err := s.cgroups()
		if err != nil || ctr != c.ctr || pod != c.pod {
			t.Errorf("Sandbox(%s) names %s in %s (%v), want %s in %s", c.in, ctr, pod, err, c.ctr, c.pod)
		}
	}
	if _, err := (Target{CgroupsPath: "/pod/abc"}).Sandbox(); err == nil {
		t.Error("a pod cgroup right under the root: want an error (no parent to keep above it)")
	}
}
