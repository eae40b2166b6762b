package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func sandboxReq(name string) *runtimeapi.RunPodSandboxRequest {
	return &runtimeapi.RunPodSandboxRequest{RuntimeHandler: "runc", Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "default", Uid: "uid-" + name},
		Labels:   map[string]string{"app": name},
	}}
}

func containerReq(sandboxID, name string) *runtimeapi.CreateContainerRequest {
	return &runtimeapi.CreateContainerRequest{PodSandboxId: sandboxID, Config: &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: "sha256:1", UserSpecifiedImage: "r/" + name + ":v1"},
		Envs:     []*runtimeapi.KeyValue{{Key: "A", Value: []byte("1")}},
	}}
}

func TestOpenCreatesDirAndFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	s := open(t, dir)
	defer s.Close()
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("state dir: %v, mode %v, want 0700", err, fi.Mode().Perm())
	}
	fi, err = os.Stat(filepath.Join(dir, "state.db"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("state.db: %v, mode %v, want 0600", err, fi.Mode().Perm())
	}
}

func TestOpenFailsOnAFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err := Open(f); err == nil {
		s.Close()
		t.Error("Open on a regular file: want an error")
	}
}

func TestPersistsAcrossReopen(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	sb, ctr := sandboxReq("web"), containerReq("sb1", "app")
	rec := &inplacedv1.SwapRecord{Id: "s1", State: inplacedv1.SwapState_SWAP_STATE_COMMITTED, StartedUnixNano: 5, Steps: []*inplacedv1.Step{{Name: "pull"}}}
	j := &JournalEntry{SwapID: "s1", Step: StepHealthGate, SandboxID: "sb1", ContainerName: "app",
		OldContainerID: "c1", NewContainerID: "c2", NewAttempt: 3, OldRequest: mustMarshal(t, ctr), NewRequest: mustMarshal(t, ctr),
		Record: mustMarshal(t, rec), Kind: "swap"}
	o := &Override{SandboxID: "sb1", Container: "app", SwapID: "s1", Hash: "h", Image: "r/app:v2",
		Env: []KV{{"A", "2"}}, Command: []string{"/x"}, Args: []string{"-v"}, Declared: []byte{9, 9}}
	rz := &inplacedv1.ResizeRecord{Id: "r1", Result: "applied", StartedUnixNano: 6}
	for _, err := range []error{
		s.PutSandbox("sb1", sb), s.PutContainer("c1", ctr), s.PutJournal(j), s.PutSwap(rec), s.PutOverride(o), s.PutResize(rz),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(t, dir)
	defer s.Close()
	if got, err := s.Sandbox("sb1"); err != nil || !proto.Equal(got, sb) {
		t.Errorf("sandbox after reopen: %v, %v", got, err)
	}
	if got, err := s.Container("c1"); err != nil || !proto.Equal(got, ctr) {
		t.Errorf("container after reopen: %v, %v", got, err)
	}
	if js, err := s.Journal(); err != nil || len(js) != 1 || fmt.Sprint(*js[0]) != fmt.Sprint(*j) {
		t.Errorf("journal after reopen: %v, %v", js, err)
	}
	if got, err := s.Swap("s1"); err != nil || !proto.Equal(got, rec) {
		t.Errorf("swap after reopen: %v, %v", got, err)
	}
	if got, err := s.Override("sb1", "app"); err != nil || fmt.Sprint(*got) != fmt.Sprint(*o) {
		t.Errorf("override after reopen: %+v, %v", got, err)
	}
	if got, err := s.Resizes(); err != nil || len(got) != 1 || !proto.Equal(got[0], rz) {
		t.Errorf("resizes after reopen: %v, %v", got, err)
	}
}

func TestSandboxesAndContainers(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	if _, err := s.Sandbox("nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing sandbox: %v, want ErrNotFound", err)
	}
	if _, err := s.Container("nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing container: %v, want ErrNotFound", err)
	}
	if err := s.PutSandbox("sb1", sandboxReq("a")); err != nil {
		t.Fatal(err)
	}
	if err := s.PutSandbox("sb1", sandboxReq("b")); err != nil { // replaces
		t.Fatal(err)
	}
	if got, _ := s.Sandbox("sb1"); got.GetConfig().GetMetadata().GetName() != "b" {
		t.Errorf("sandbox not replaced: %v", got)
	}
	for _, id := range []string{"c1", "c2"} {
		if err := s.PutContainer(id, containerReq("sb1", id)); err != nil {
			t.Fatal(err)
		}
	}
	ids, err := s.ContainerIDs()
	if err != nil || fmt.Sprint(ids) != "[c1 c2]" {
		t.Errorf("ContainerIDs = %v, %v", ids, err)
	}
	if err := s.DeleteContainer("c1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteContainer("c1"); err != nil { // twice is fine
		t.Errorf("second delete: %v", err)
	}
	if _, err := s.Container("c1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleted container: %v", err)
	}
	if got, err := s.Container("c2"); err != nil || got.Config.Metadata.Name != "c2" {
		t.Errorf("other container: %v, %v", got, err)
	}
	sids, err := s.SandboxIDs()
	if err != nil || fmt.Sprint(sids) != "[sb1]" {
		t.Errorf("SandboxIDs = %v, %v", sids, err)
	}
}

// TestReturnedValuesAreCopies: a value read from the store must stay valid
// after the transaction, and changing it must not change the store.
func TestReturnedValuesAreCopies(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	want := containerReq("sb1", "app")
	if err := s.PutContainer("c1", want); err != nil {
		t.Fatal(err)
	}
	got, _ := s.Container("c1")
	got.Config.Envs[0].Value[0] = 'X'
	// Writes in between remap bbolt's pages.
	for i := 0; i < 200; i++ {
		if err := s.PutContainer(fmt.Sprintf("pad-%03d", i), containerReq("sb1", fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	again, _ := s.Container("c1")
	if !proto.Equal(again, want) {
		t.Errorf("store changed through a returned value: %v", again)
	}
}

func TestDeleteSandboxDropsItsContainersAndOverridesOnly(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	for _, sb := range []string{"sb1", "sb10", "sb2"} {
		if err := s.PutSandbox(sb, sandboxReq(sb)); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"app", "side", "third"} {
			if err := s.PutContainer(sb+"-"+name, containerReq(sb, name)); err != nil {
				t.Fatal(err)
			}
			if err := s.PutOverride(&Override{SandboxID: sb, Container: name, Image: sb}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.PutJournal(&JournalEntry{SwapID: "s1", SandboxID: "sb1"}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutSwap(&inplacedv1.SwapRecord{Id: "s1", SandboxId: "sb1"}); err != nil {
		t.Fatal(err)
	}

	if err := s.DeleteSandbox("sb1"); err != nil {
		t.Fatal(err)
	}

	if _, err := s.Sandbox("sb1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("sandbox sb1 still there: %v", err)
	}
	ids, _ := s.ContainerIDs()
	if fmt.Sprint(ids) != "[sb10-app sb10-side sb10-third sb2-app sb2-side sb2-third]" {
		t.Errorf("containers left: %v", ids)
	}
	ovs, _ := s.Overrides()
	var left []string
	for _, o := range ovs {
		left = append(left, o.SandboxID+"/"+o.Container)
	}
	if fmt.Sprint(left) != "[sb10/app sb10/side sb10/third sb2/app sb2/side sb2/third]" {
		t.Errorf("overrides left: %v (sb10 shares sb1's prefix)", left)
	}
	for _, sb := range []string{"sb10", "sb2"} {
		if _, err := s.Sandbox(sb); err != nil {
			t.Errorf("sandbox %s dropped: %v", sb, err)
		}
	}
	// History and journal are not the sandbox's to drop.
	if js, _ := s.Journal(); len(js) != 1 {
		t.Errorf("journal: %v", js)
	}
	if _, err := s.Swap("s1"); err != nil {
		t.Errorf("history: %v", err)
	}
	// A sandbox that was never recorded is fine.
	if err := s.DeleteSandbox("unknown"); err != nil {
		t.Errorf("DeleteSandbox(unknown): %v", err)
	}
}

func TestJournal(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	if js, err := s.Journal(); err != nil || len(js) != 0 {
		t.Fatalf("empty journal: %v, %v", js, err)
	}
	for _, id := range []string{"b", "a"} {
		if err := s.PutJournal(&JournalEntry{SwapID: id, Step: StepPrepared}); err != nil {
			t.Fatal(err)
		}
	}
	// A later step of the same swap replaces the entry.
	if err := s.PutJournal(&JournalEntry{SwapID: "a", Step: StepStartNew, NewContainerID: "c2", NewAttempt: 4}); err != nil {
		t.Fatal(err)
	}
	js, err := s.Journal()
	if err != nil || len(js) != 2 {
		t.Fatalf("journal: %v, %v", js, err)
	}
	if js[0].SwapID != "a" || js[0].Step != StepStartNew || js[0].NewContainerID != "c2" || js[0].NewAttempt != 4 {
		t.Errorf("entry a = %+v", js[0])
	}
	if err := s.DeleteJournal("a"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteJournal("never"); err != nil {
		t.Errorf("delete of a missing entry: %v", err)
	}
	if js, _ := s.Journal(); len(js) != 1 || js[0].SwapID != "b" {
		t.Errorf("journal after delete: %v", js)
	}
	// A corrupt entry is set aside (kept, reported, recorded as a failed
	// swap); the others are still listed.
	var told []string
	s.OnSetAside(func(id string, err error) { told = append(told, id+": "+err.Error()) })
	for id, v := range map[string][]byte{"bad": []byte("{"), "badproto": []byte(`{"swapID":"badproto","record":"/w=="}`)} {
		if err := s.put(bucketJournal, id, v); err != nil {
			t.Fatal(err)
		}
	}
	if js, err := s.Journal(); err != nil || len(js) != 1 || js[0].SwapID != "b" {
		t.Errorf("journal with corrupt entries: %v, %v; want entry b alone", js, err)
	}
	if len(told) != 2 {
		t.Errorf("set aside told %q, want 2", told)
	}
	for _, id := range []string{"bad", "badproto"} {
		if rec, err := s.Swap(id); err != nil || rec.State != inplacedv1.SwapState_SWAP_STATE_FAILED || !strings.Contains(rec.Error, "set aside") {
			t.Errorf("record of set-aside entry %s: %v, %v", id, rec, err)
		}
	}
	if v, err := s.get(BucketSetAside, "bad"); err != nil || string(v) != "{" {
		t.Errorf("set-aside bytes: %q, %v; want them kept as they were", v, err)
	}
	if js, err := s.Journal(); err != nil || len(js) != 1 || len(told) != 2 {
		t.Errorf("second listing: %v, %v, told %d", js, err, len(told))
	}
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestJournalStepsInOrder(t *testing.T) {
	want := []JournalStep{"prepared", "pre-stop", "stop-old", "create-new", "start-new", "health-gate", "rolling-back"}
	got := []JournalStep{StepPrepared, StepPreStop, StepStopOld, StepCreateNew, StepStartNew, StepHealthGate, StepRollingBack}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("journal steps %v, want %v (names are on disk: never rename)", got, want)
	}
}

func TestSwapHistoryOrder(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	// Keys out of start order: Swaps sorts by start time, not by key.
	for _, r := range []struct {
		id    string
		start int64
	}{{"c", 1}, {"a", 3}, {"b", 2}} {
		if err := s.PutSwap(&inplacedv1.SwapRecord{Id: r.id, StartedUnixNano: r.start}); err != nil {
			t.Fatal(err)
		}
	}
	// Rewriting a record (running → committed) keeps one entry.
	if err := s.PutSwap(&inplacedv1.SwapRecord{Id: "b", StartedUnixNano: 2, State: inplacedv1.SwapState_SWAP_STATE_COMMITTED}); err != nil {
		t.Fatal(err)
	}
	recs, err := s.Swaps()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range recs {
		ids = append(ids, r.Id)
	}
	if fmt.Sprint(ids) != "[c b a]" {
		t.Errorf("order %v, want [c b a] (oldest first)", ids)
	}
	if recs[1].State != inplacedv1.SwapState_SWAP_STATE_COMMITTED {
		t.Errorf("rewritten record state %s", recs[1].State)
	}
	if _, err := s.Swap("zzz"); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing swap: %v", err)
	}
}

func swapID(i int) string {
	return time.Unix(1_800_000_000+int64(i), 0).UTC().Format("20060102T150405.000") + "-0000"
}

func TestSwapHistoryTrim(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	// Fill past the limit in one transaction (a PutSwap each would fsync
	// 1000 times): the next PutSwap trims several at once.
	err := s.db.Update(func(tx *bolt.Tx) error {
		for i := 0; i < historyLimit+2; i++ {
			b, _ := proto.Marshal(&inplacedv1.SwapRecord{Id: swapID(i), StartedUnixNano: int64(i)})
			if err := tx.Bucket(bucketSwaps).Put([]byte(swapID(i)), b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := historyLimit + 2; i < historyLimit+5; i++ {
		if err := s.PutSwap(&inplacedv1.SwapRecord{Id: swapID(i), StartedUnixNano: int64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := s.Swaps()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != historyLimit {
		t.Fatalf("%d records, want %d", len(recs), historyLimit)
	}
	if recs[0].Id != swapID(5) || recs[len(recs)-1].Id != swapID(historyLimit+4) {
		t.Errorf("kept %s … %s, want %s … %s", recs[0].Id, recs[len(recs)-1].Id, swapID(5), swapID(historyLimit+4))
	}
	for i := 0; i < 5; i++ {
		if _, err := s.Swap(swapID(i)); !errors.Is(err, ErrNotFound) {
			t.Errorf("oldest record %d not trimmed: %v", i, err)
		}
	}
	// Resizes are trimmed on their own.
	if err := s.PutResize(&inplacedv1.ResizeRecord{Id: swapID(0)}); err != nil {
		t.Fatal(err)
	}
	if rz, _ := s.Resizes(); len(rz) != 1 {
		t.Errorf("resizes: %d, want 1", len(rz))
	}
}

func TestOverrides(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	if _, err := s.Override("sb1", "app"); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing override: %v", err)
	}
	if err := s.PutOverride(&Override{SandboxID: "sb1", Container: "app", Image: "v2"}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutOverride(&Override{SandboxID: "sb1", Container: "app", Image: "v3"}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutOverride(&Override{SandboxID: "sb1", Container: "side", Image: "s"}); err != nil {
		t.Fatal(err)
	}
	if o, err := s.Override("sb1", "app"); err != nil || o.Image != "v3" {
		t.Errorf("override = %+v, %v, want the latest", o, err)
	}
	if err := s.DeleteOverride("sb1", "app"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Override("sb1", "app"); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleted override: %v", err)
	}
	if all, _ := s.Overrides(); len(all) != 1 || all[0].Container != "side" {
		t.Errorf("overrides = %v", all)
	}
}
