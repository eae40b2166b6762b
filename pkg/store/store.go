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
)

// ErrNotFound is returned when a key is not in the store.
var ErrNotFound = errors.New("not found")

// historyLimit bounds the swap and resize history kept per bucket.
const historyLimit = 1000

// Store is the state database.
type Store struct {
	db *bolt.DB
}

// Open opens (creating if needed) dir/state.db. Only one inplaced may hold it.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, "state.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open state %s (is another inplaced running?): %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketSandboxes, bucketContainers, bucketJournal, bucketSwaps, bucketOverrides, bucketResizes} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init state %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

func (s *Store) put(bucket []byte, key string, val []byte) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).Put([]byte(key), val)
	})
}

func (s *Store) get(bucket []byte, key string) ([]byte, error) {
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
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
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).Delete([]byte(key))
	})
}

func (s *Store) each(bucket []byte, fn func(k string, v []byte) error) error {
	return s.db.View(func(tx *bolt.Tx) error {
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

func (s *Store) getProto(bucket []byte, key string, m proto.Message) error {
	b, err := s.get(bucket, key)
	if err != nil {
		return err
	}
	return proto.Unmarshal(b, m)
}

// PutSandbox records the config a sandbox was created with.
func (s *Store) PutSandbox(id string, req *runtimeapi.RunPodSandboxRequest) error {
	return s.putProto(bucketSandboxes, id, req)
}

// Sandbox returns a recorded sandbox config.
func (s *Store) Sandbox(id string) (*runtimeapi.RunPodSandboxRequest, error) {
	req := &runtimeapi.RunPodSandboxRequest{}
	if err := s.getProto(bucketSandboxes, id, req); err != nil {
		return nil, err
	}
	return req, nil
}

// DeleteSandbox drops a sandbox, the containers recorded in it and its
// overrides: overrides end with their sandbox.
func (s *Store) DeleteSandbox(id string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
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
	req := &runtimeapi.CreateContainerRequest{}
	if err := s.getProto(bucketContainers, id, req); err != nil {
		return nil, err
	}
	return req, nil
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

// Journal lists unfinished swaps.
func (s *Store) Journal() ([]*JournalEntry, error) {
	var out []*JournalEntry
	err := s.each(bucketJournal, func(_ string, v []byte) error {
		e := &JournalEntry{}
		if err := json.Unmarshal(v, e); err != nil {
			return fmt.Errorf("decode journal entry: %w", err)
		}
		out = append(out, e)
		return nil
	})
	return out, err
}

// putHistory stores a history record and trims the bucket.
func (s *Store) putHistory(bucket []byte, id string, m proto.Message) error {
	if err := s.putProto(bucket, id, m); err != nil {
		return err
	}
	return s.trim(bucket)
}

// listHistory decodes every record of a history bucket, oldest first.
func listHistory[T any, PT interface {
	*T
	proto.Message
}](s *Store, bucket []byte, started func(PT) int64) ([]PT, error) {
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
	r := &inplacedv1.SwapRecord{}
	if err := s.getProto(bucketSwaps, id, r); err != nil {
		return nil, err
	}
	return r, nil
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
	return s.db.Update(func(tx *bolt.Tx) error {
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
