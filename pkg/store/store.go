// Package store is inplaced's durable state, one bbolt file in --state-dir.
//
// Schema (bucket → key → value):
//
//	sandboxes  sandbox ID            → RunPodSandboxRequest (protobuf)
//	containers container ID          → CreateContainerRequest (protobuf)
//	journal    swap ID               → JournalEntry (JSON): unfinished swaps only
//	swaps      swap ID               → SwapRecord (protobuf): history
//	overrides  sandbox ID/name       → Override (JSON): sticky swap results
//	resizes    resize ID             → ResizeRecord (protobuf): history
//
// Every write is a bbolt transaction, which fsyncs before it returns: a
// journal step written with PutJournal is on disk before the step runs.
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

var (
	bucketSandboxes  = []byte("sandboxes")
	bucketContainers = []byte("containers")
	bucketJournal    = []byte("journal")
	bucketSwaps      = []byte("swaps")
	bucketOverrides  = []byte("overrides")
	bucketResizes    = []byte("resizes")
	// BucketSetAside keeps journal entries that could not be decoded,
	// byte for byte, for inspection (bbolt get state.db journal-set-aside <swap ID>).
	BucketSetAside = []byte("journal-set-aside")
)

var buckets = [][]byte{bucketSandboxes, bucketContainers, bucketJournal, bucketSwaps, bucketOverrides, bucketResizes, BucketSetAside}

// ErrNotFound is returned when a key is not in the store.
var ErrNotFound = errors.New("not found")

// historyLimit bounds the swap and resize history kept per bucket.
const historyLimit = 1000

// Store is the state database. A Store made by OpenOrDegrade may be
// unusable (Problem says why): its methods then return ErrUnavailable, and
// Retry brings it back once the cause is gone.
type Store struct {
	dir, path string

	// mu guards db and problem; readers keep it locked for a whole transaction so
	// that Retry never closes a db under one.
	mu      sync.RWMutex
	db      *bolt.DB // nil: the file could not be opened
	problem *Problem // nil: healthy

	setAside func(swapID string, err error)
}

// Open opens (creating if needed) dir/state.db, or fails: for tools and
// tests that want the store or nothing. inplaced uses OpenOrDegrade.
func Open(dir string) (*Store, error) {
	s := OpenOrDegrade(dir)
	if p := s.Problem(); p != nil {
		s.Close()
		return nil, p
	}
	return s, nil
}

// OpenOrDegrade opens dir/state.db and never fails: when the file cannot be
// opened (damaged, full or read-only filesystem, locked by another process)
// or written, the Store is returned unusable, with the Problem, and is
// repaired by Retry. The file is never removed or rewritten to get there.
func OpenOrDegrade(dir string) *Store {
	s := &Store{dir: dir, path: filepath.Join(dir, "state.db")}
	db, err := openDB(dir, s.path)
	s.db = db
	if err != nil {
		s.problem = newProblem(s.path, err)
	}
	return s
}

// openDB opens and checks the file and creates the buckets. A panic of
// bbolt on a damaged file is an error. db comes back open with err set when
// only the write probe failed: the records can still be read (overrides
// still apply to kubelet's calls) while nothing new can be written.
func openDB(dir, path string) (db *bolt.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", errDamaged, r)
			if db != nil {
				db.Close()
				db = nil
			}
		}
	}()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state dir %s: %w", dir, err)
	}
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: lockTimeout})
	if err != nil {
		return nil, fmt.Errorf("open: %w", err) // the Problem names the file
	}
	if err := initDB(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return db, probeWrite(dir)
}

// initDB checks the file's consistency and creates the missing buckets.
func initDB(db *bolt.DB) error {
	missing := false
	err := db.View(func(tx *bolt.Tx) error {
		var first error
		for err := range tx.Check() { // drained: the checker reads tx until it closes the channel
			if first == nil {
				first = err
			}
		}
		if first != nil {
			return fmt.Errorf("%w: %v", errDamaged, first)
		}
		for _, b := range buckets {
			missing = missing || tx.Bucket(b) == nil
		}
		return nil
	})
	if err != nil || !missing {
		return err
	}
	return db.Update(func(tx *bolt.Tx) error {
		for _, b := range buckets {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
}

// Close closes the database.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.db == nil {
		return nil
	}
	err := s.db.Close()
	s.db = nil
	return err
}

// Problem is why the store is unusable now; nil when it is healthy.
func (s *Store) Problem() *Problem {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.problem
}

// Usable returns nil when the store can be read and written, else an error
// wrapping ErrUnavailable that says what is wrong and what to do.
func (s *Store) Usable() error {
	if p := s.Problem(); p != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, p)
	}
	return nil
}

// Retry tries to repair an unusable store: open the file again (a new one
// is created when the damaged one was moved aside), or, when only writes
// failed, check that the filesystem takes writes again. It reports whether
// the store went from unusable to healthy.
func (s *Store) Retry() (repaired bool) {
	s.mu.RLock()
	p, db := s.problem, s.db
	s.mu.RUnlock()
	if p == nil {
		return false
	}
	if db != nil && p.Cause != CauseDamaged {
		if err := probeWrite(s.dir); err != nil {
			s.setProblem(err)
			return false
		}
		s.mu.Lock()
		s.problem = nil
		s.mu.Unlock()
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.db != nil {
		s.db.Close()
		s.db = nil
	}
	db, err := openDB(s.dir, s.path)
	s.db = db
	if err != nil {
		s.problem = keepSince(s.problem, newProblem(s.path, err))
		return false
	}
	s.problem = nil
	return true
}

// setProblem records a failure seen while the store was in use.
func (s *Store) setProblem(err error) {
	np := newProblem(s.path, err)
	s.mu.Lock()
	s.problem = keepSince(s.problem, np)
	s.mu.Unlock()
}

// unusable is the error of a call made while the store cannot serve it.
func unusable(p *Problem) error { return fmt.Errorf("%w: %v", ErrUnavailable, p) }

// view runs fn in a read transaction. A panic of bbolt (a page damaged
// after the open-time check) marks the store damaged instead of ending
// inplaced.
func (s *Store) view(fn func(*bolt.Tx) error) (err error) {
	return s.txn(false, fn)
}

// update runs fn in a write transaction; a filesystem error makes the store
// unusable for swaps until Retry sees the filesystem take writes again.
func (s *Store) update(fn func(*bolt.Tx) error) error {
	return s.txn(true, fn)
}

func (s *Store) txn(write bool, fn func(*bolt.Tx) error) (err error) {
	s.mu.RLock()
	locked := true
	unlock := func() {
		if locked {
			locked = false
			s.mu.RUnlock()
		}
	}
	defer unlock()
	if s.db == nil {
		return unusable(s.problem)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", errDamaged, r)
		}
		if err != nil && isStorageError(err) {
			unlock()
			s.setProblem(err)
		}
	}()
	if write {
		return s.db.Update(fn)
	}
	return s.db.View(fn)
}

func (s *Store) put(bucket []byte, key string, val []byte) error {
	return s.update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).Put([]byte(key), val)
	})
}

func (s *Store) get(bucket []byte, key string) ([]byte, error) {
	var out []byte
	err := s.view(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucket).Get([]byte(key))
		if v == nil {
			return fmt.Errorf("%s %q: %w", bucket, key, ErrNotFound)
		}
		out = append([]byte(nil), v...)
		return nil
	})
	return out, err
}

func (s *Store) del(bucket []byte, key string) error {
	return s.update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).Delete([]byte(key))
	})
}

func (s *Store) each(bucket []byte, fn func(k string, v []byte) error) error {
	return s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).ForEach(func(k, v []byte) error { return fn(string(k), v) })
	})
}

func (s *Store) putProto(bucket []byte, key string, m proto.Message) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode %s %q: %w", bucket, key, err)
	}
	return s.put(bucket, key, b)
}

// protoPtr is a pointer to a protobuf message type T, so that a generic
// reader can make a new T to decode into.
type protoPtr[T any] interface {
	*T
	proto.Message
}

// getProto reads the message at key of bucket.
func getProto[T any, PT protoPtr[T]](s *Store, bucket []byte, key string) (PT, error) {
	b, err := s.get(bucket, key)
	if err != nil {
		return nil, err
	}
	m := PT(new(T))
	if err := proto.Unmarshal(b, m); err != nil {
		return nil, err
	}
	return m, nil
}

// PutSandbox records the config a sandbox was created with.
func (s *Store) PutSandbox(id string, req *runtimeapi.RunPodSandboxRequest) error {
	return s.putProto(bucketSandboxes, id, req)
}

// Sandbox returns a recorded sandbox config.
func (s *Store) Sandbox(id string) (*runtimeapi.RunPodSandboxRequest, error) {
	return getProto[runtimeapi.RunPodSandboxRequest](s, bucketSandboxes, id)
}

// DeleteSandbox drops a sandbox, the containers recorded in it and its
// overrides: overrides end with their sandbox.
func (s *Store) DeleteSandbox(id string) error {
	return s.update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketSandboxes).Delete([]byte(id)); err != nil {
			return err
		}
		cb := tx.Bucket(bucketContainers)
		var drop [][]byte
		err := cb.ForEach(func(k, v []byte) error {
			req := &runtimeapi.CreateContainerRequest{}
			if proto.Unmarshal(v, req) == nil && req.PodSandboxId == id {
				drop = append(drop, append([]byte(nil), k...))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range drop {
			if err := cb.Delete(k); err != nil {
				return err
			}
		}
		ob := tx.Bucket(bucketOverrides)
		c := ob.Cursor()
		prefix := []byte(id + "/")
		for k, _ := c.Seek(prefix); k != nil && len(k) >= len(prefix) && string(k[:len(prefix)]) == string(prefix); k, _ = c.Next() {
			if err := c.Delete(); err != nil {
				return err
			}
		}
		return nil
	})
}

// PutContainer records the request a container was created with.
func (s *Store) PutContainer(id string, req *runtimeapi.CreateContainerRequest) error {
	return s.putProto(bucketContainers, id, req)
}

// Container returns a recorded container create request.
func (s *Store) Container(id string) (*runtimeapi.CreateContainerRequest, error) {
	return getProto[runtimeapi.CreateContainerRequest](s, bucketContainers, id)
}

// DeleteContainer drops a container's record.
func (s *Store) DeleteContainer(id string) error { return s.del(bucketContainers, id) }

// ContainerIDs lists the recorded container IDs.
func (s *Store) ContainerIDs() ([]string, error) {
	var ids []string
	err := s.each(bucketContainers, func(k string, _ []byte) error { ids = append(ids, k); return nil })
	return ids, err
}

// SandboxIDs lists the recorded sandbox IDs.
func (s *Store) SandboxIDs() ([]string, error) {
	var ids []string
	err := s.each(bucketSandboxes, func(k string, _ []byte) error { ids = append(ids, k); return nil })
	return ids, err
}

// PutJournal writes a swap's journal entry; it is durable when this returns.
func (s *Store) PutJournal(e *JournalEntry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return s.put(bucketJournal, e.SwapID, b)
}

// DeleteJournal removes a finished swap's journal entry.
func (s *Store) DeleteJournal(id string) error { return s.del(bucketJournal, id) }

// Journal lists unfinished swaps. An entry that cannot be decoded (a torn
// or foreign write) is set aside: moved byte for byte to BucketSetAside,
// recorded as a failed swap in the history and told to the OnSetAside
// function, so that it neither blocks the recovery of the others nor is
// lost.
func (s *Store) Journal() ([]*JournalEntry, error) {
	var out []*JournalEntry
	bad := map[string]error{}
	err := s.each(bucketJournal, func(k string, v []byte) error {
		e, err := decodeJournal(k, v)
		if err != nil {
			bad[k] = err
			return nil
		}
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	for id, derr := range bad {
		s.setAsideJournal(id, derr)
	}
	return out, nil
}

// OnSetAside installs f, told of each journal entry set aside; call it
// before the first Journal.
func (s *Store) OnSetAside(f func(swapID string, err error)) { s.setAside = f }

// decodeJournal decodes an entry and the records recovery will decode.
func decodeJournal(key string, v []byte) (*JournalEntry, error) {
	e := &JournalEntry{}
	if err := json.Unmarshal(v, e); err != nil {
		return nil, err
	}
	if e.SwapID != key {
		return nil, fmt.Errorf("swap ID %q under key %q", e.SwapID, key)
	}
	for what, m := range map[string]struct {
		b []byte
		m proto.Message
	}{
		"record": {e.Record, &inplacedv1.SwapRecord{}}, "old config": {e.OldRequest, &runtimeapi.CreateContainerRequest{}},
		"new config": {e.NewRequest, &runtimeapi.CreateContainerRequest{}},
	} {
		if err := proto.Unmarshal(m.b, m.m); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
	}
	return e, nil
}

// setAsideJournal moves an undecodable entry out of the journal and leaves
// a failed swap record that says where it is.
func (s *Store) setAsideJournal(id string, derr error) {
	err := s.update(func(tx *bolt.Tx) error {
		j := tx.Bucket(bucketJournal)
		v := append([]byte(nil), j.Get([]byte(id))...)
		b, err := proto.Marshal(setAsideRecord(id, v, fmt.Sprintf("journal entry could not be decoded (%v): set aside in %s, "+
			"bucket %s, and not recovered; kubelet restarts the container if the swap had stopped it", derr, s.path, BucketSetAside)))
		if err != nil {
			return err
		}
		if err := tx.Bucket(BucketSetAside).Put([]byte(id), v); err != nil {
			return err
		}
		if err := tx.Bucket(bucketSwaps).Put([]byte(id), b); err != nil {
			return err
		}
		return j.Delete([]byte(id))
	})
	if err != nil {
		derr = fmt.Errorf("%w (and it could not be set aside: %v)", derr, err)
	}
	if s.setAside != nil {
		s.setAside(id, derr)
	}
}

// setAsideRecord is the failed swap record of a set-aside entry: what can
// still be read of the entry's own record (pod, container), else the ID.
func setAsideRecord(id string, v []byte, why string) *inplacedv1.SwapRecord {
	rec := &inplacedv1.SwapRecord{}
	var e JournalEntry
	if json.Unmarshal(v, &e) == nil && proto.Unmarshal(e.Record, rec) != nil {
		rec = &inplacedv1.SwapRecord{}
	}
	now := time.Now().UnixNano()
	rec.Id, rec.State, rec.Error, rec.FinishedUnixNano = id, inplacedv1.SwapState_SWAP_STATE_FAILED, why, now
	if rec.Kind == "" {
		rec.Kind = "swap"
	}
	if rec.StartedUnixNano == 0 {
		rec.StartedUnixNano = now
	}
	return rec
}

// putHistory stores a history record and trims the bucket.
func (s *Store) putHistory(bucket []byte, id string, m proto.Message) error {
	if err := s.putProto(bucket, id, m); err != nil {
		return err
	}
	return s.trim(bucket)
}

// listHistory decodes every record of a history bucket, oldest first.
func listHistory[T any, PT protoPtr[T]](s *Store, bucket []byte, started func(PT) int64) ([]PT, error) {
	var out []PT
	err := s.each(bucket, func(k string, v []byte) error {
		r := PT(new(T))
		if err := proto.Unmarshal(v, r); err != nil {
			return fmt.Errorf("decode %s %q: %w", bucket, k, err)
		}
		out = append(out, r)
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return started(out[i]) < started(out[j]) })
	return out, err
}

// PutSwap stores a swap record (history).
func (s *Store) PutSwap(r *inplacedv1.SwapRecord) error { return s.putHistory(bucketSwaps, r.Id, r) }

// Swap returns one swap record.
func (s *Store) Swap(id string) (*inplacedv1.SwapRecord, error) {
	return getProto[inplacedv1.SwapRecord](s, bucketSwaps, id)
}

// Swaps lists swap records, oldest first.
func (s *Store) Swaps() ([]*inplacedv1.SwapRecord, error) {
	return listHistory(s, bucketSwaps, (*inplacedv1.SwapRecord).GetStartedUnixNano)
}

// PutResize stores a resize record (history).
func (s *Store) PutResize(r *inplacedv1.ResizeRecord) error {
	return s.putHistory(bucketResizes, r.Id, r)
}

// Resizes lists resize records, oldest first.
func (s *Store) Resizes() ([]*inplacedv1.ResizeRecord, error) {
	return listHistory(s, bucketResizes, (*inplacedv1.ResizeRecord).GetStartedUnixNano)
}

// trim keeps the newest historyLimit records. IDs are time-ordered, so the
// first keys are the oldest.
func (s *Store) trim(bucket []byte) error {
	return s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucket)
		n := b.Stats().KeyN
		c := b.Cursor()
		for k, _ := c.First(); k != nil && n > historyLimit; k, _ = c.Next() {
			if err := c.Delete(); err != nil {
				return err
			}
			n--
		}
		return nil
	})
}

func overrideKey(sandboxID, name string) string { return sandboxID + "/" + name }

// PutOverride records the sticky result of a committed swap.
func (s *Store) PutOverride(o *Override) error {
	b, err := json.Marshal(o)
	if err != nil {
		return err
	}
	return s.put(bucketOverrides, overrideKey(o.SandboxID, o.Container), b)
}

// Override returns the override for a container name in a sandbox.
func (s *Store) Override(sandboxID, name string) (*Override, error) {
	b, err := s.get(bucketOverrides, overrideKey(sandboxID, name))
	if err != nil {
		return nil, err
	}
	o := &Override{}
	return o, json.Unmarshal(b, o)
}

// DeleteOverride drops an override.
func (s *Store) DeleteOverride(sandboxID, name string) error {
	return s.del(bucketOverrides, overrideKey(sandboxID, name))
}

// Overrides lists active overrides.
func (s *Store) Overrides() ([]*Override, error) {
	var out []*Override
	err := s.each(bucketOverrides, func(_ string, v []byte) error {
		o := &Override{}
		if err := json.Unmarshal(v, o); err != nil {
			return err
		}
		out = append(out, o)
		return nil
	})
	return out, err
}

// Path is the state file.
func (s *Store) Path() string { return s.path }
