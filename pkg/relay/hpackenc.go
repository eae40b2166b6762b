package relay

import (
	"unsafe"

	"golang.org/x/net/http2/hpack"
)

// headerEncoder is the HPACK encoder (RFC 7541) of one connection the
// router writes header blocks to.
//
// The router encodes every field it decoded on the other side, ~15 per
// call. x/net's hpack.Encoder finds each in its tables with three map
// lookups on the name and value strings, which was 16% of the router's CPU
// at 16 callers (BenchmarkRelayCost's profile after headerBlock). The
// fields the router passes on are mostly the decoder's own table entries
// or constants: the same strings, at the same addresses, call after call.
// So a small cache keyed by the strings' addresses remembers where each
// field sits in this encoder's table, and most fields cost a pointer
// comparison. The rest is hpack.Encoder's algorithm: the same choices of
// representation (static table first, incremental indexing unless
// sensitive or larger than the table), x/net's Huffman coder.
type headerEncoder struct {
	buf []byte // the block being encoded

	maxSize  uint32 // the dynamic table's size limit
	minSize  uint32 // the smallest limit since the last block: signalled first (§4.2)
	update   bool   // a dynamic table size update must open the next block
	size     uint32 // what the dynamic table holds (§4.1)
	entries  []hpack.HeaderField
	first    int    // entries[first:] are live, oldest first
	inserted uint64 // entries ever added; entry k (1-based) is at index 61 + inserted - k + 1
	byPair   map[pairKey]uint64
	byName   map[string]uint64

	recent [64]recentField
}

type pairKey struct{ name, value string }

// recentField is a field this encoder saw, with the strings it came in
// (holding them keeps their addresses from being reused for others) and
// where it sits: a static index, or an entry of the dynamic table.
type recentField struct {
	name, value string
	static      uint8  // its static index, if it has one
	entry       uint64 // its dynamic entry, if static is 0
}

const (
	staticLen       = 61
	defaultTableMax = 4096
)

var (
	staticPair = map[pairKey]uint8{}
	staticName = map[string]uint8{}
)

// The static table, read back through x/net's decoder (it does not export
// it): 0x80|i is an indexed field, index i.
func init() {
	var fields []hpack.HeaderField
	d := hpack.NewDecoder(defaultTableMax, func(f hpack.HeaderField) { fields = append(fields, f) })
	for i := 1; i <= staticLen; i++ {
		if _, err := d.Write([]byte{0x80 | byte(i)}); err != nil {
			panic(err)
		}
	}
	for i := len(fields) - 1; i >= 0; i-- { // the lowest index wins
		staticPair[pairKey{fields[i].Name, fields[i].Value}] = uint8(i + 1)
		staticName[fields[i].Name] = uint8(i + 1)
	}
}

func newHeaderEncoder() *headerEncoder {
	return &headerEncoder{maxSize: defaultTableMax, minSize: defaultTableMax, byPair: map[pairKey]uint64{}, byName: map[string]uint64{}}
}

// limit applies the peer's SETTINGS_HEADER_TABLE_SIZE: the table never
// grows past 4096, and shrinks to a smaller limit at once.
func (e *headerEncoder) limit(v uint32) {
	if v >= e.maxSize {
		return
	}
	e.maxSize = v
	e.minSize = min(e.minSize, v)
	e.update = true
	e.evict(0)
}

// block starts a header block.
func (e *headerEncoder) block() {
	e.buf = e.buf[:0]
	if e.update {
		if e.minSize < e.maxSize {
			e.buf = appendVarInt(e.buf, 5, 0x20, uint64(e.minSize))
		}
		e.buf = appendVarInt(e.buf, 5, 0x20, uint64(e.maxSize))
		e.update, e.minSize = false, e.maxSize
	}
}

// field appends f to the block.
func (e *headerEncoder) field(f hpack.HeaderField) {
	slot := &e.recent[recentSlot(f)]
	if !f.Sensitive && sameStrings(slot.name, f.Name) && sameStrings(slot.value, f.Value) {
		// Seen before, at the same addresses: most fields of most calls.
		if slot.static != 0 {
			e.buf = appendVarInt(e.buf, 7, 0x80, uint64(slot.static))
			return
		}
		if idx, ok := e.index(slot.entry); ok {
			e.buf = appendVarInt(e.buf, 7, 0x80, idx)
			return
		}
	}
	if !f.Sensitive && e.indexedPair(f, slot) {
		return
	}
	e.literal(f, slot)
}

// indexedPair writes f as an indexed field if the static table or a
// dynamic entry still in the table holds it, remembers where in slot, and
// says whether it did.
func (e *headerEncoder) indexedPair(f hpack.HeaderField, slot *recentField) bool {
	if s := staticPair[pairKey{f.Name, f.Value}]; s != 0 {
		*slot = recentField{name: f.Name, value: f.Value, static: s}
		e.buf = appendVarInt(e.buf, 7, 0x80, uint64(s))
		return true
	}
	if k := e.byPair[pairKey{f.Name, f.Value}]; k != 0 {
		if idx, ok := e.index(k); ok {
			*slot = recentField{name: f.Name, value: f.Value, entry: k}
			e.buf = appendVarInt(e.buf, 7, 0x80, idx)
			return true
		}
	}
	return false
}

// literal writes f as a literal field, its name indexed if a table holds
// it, and adds it to the dynamic table if it may be.
func (e *headerEncoder) literal(f hpack.HeaderField, slot *recentField) {
	nameIdx := uint64(0)
	if s := staticName[f.Name]; s != 0 {
		nameIdx = uint64(s)
	} else if k := e.byName[f.Name]; k != 0 {
		nameIdx, _ = e.index(k)
	}
	indexing := !f.Sensitive && f.Size() <= e.maxSize
	switch {
	case indexing:
		e.buf = appendVarInt(e.buf, 6, 0x40, nameIdx)
	case f.Sensitive:
		e.buf = appendVarInt(e.buf, 4, 0x10, nameIdx)
	default:
		e.buf = appendVarInt(e.buf, 4, 0x00, nameIdx)
	}
	if nameIdx == 0 {
		e.buf = appendString(e.buf, f.Name)
	}
	e.buf = appendString(e.buf, f.Value)
	if indexing {
		e.add(f)
		*slot = recentField{name: f.Name, value: f.Value, entry: e.inserted}
	}
}

// index is dynamic entry k's index, if it is still in the table.
func (e *headerEncoder) index(k uint64) (uint64, bool) {
	age := e.inserted - k // 0: the newest
	if k == 0 || age >= uint64(len(e.entries)-e.first) {
		return 0, false
	}
	return staticLen + 1 + age, true
}

func (e *headerEncoder) add(f hpack.HeaderField) {
	e.evict(f.Size())
	e.entries = append(e.entries, f)
	e.size += f.Size()
	e.inserted++
	e.byPair[pairKey{f.Name, f.Value}] = e.inserted
	e.byName[f.Name] = e.inserted
}

// evict drops the oldest entries until room more bytes fit.
func (e *headerEncoder) evict(room uint32) {
	for e.size+room > e.maxSize && e.first < len(e.entries) {
		old := e.entries[e.first]
		k := e.inserted - uint64(len(e.entries)-e.first) + 1
		e.entries[e.first] = hpack.HeaderField{}
		e.first++
		e.size -= old.Size()
		if e.byPair[pairKey{old.Name, old.Value}] == k {
			delete(e.byPair, pairKey{old.Name, old.Value})
		}
		if e.byName[old.Name] == k {
			delete(e.byName, old.Name)
		}
	}
	if e.first > 64 && e.first*2 > len(e.entries) { // reuse the slice's front
		n := copy(e.entries, e.entries[e.first:])
		clear(e.entries[n:])
		e.entries = e.entries[:n]
		e.first = 0
	}
}

// recentSlot picks a field's cache slot from its strings' addresses.
func recentSlot(f hpack.HeaderField) uintptr {
	h := uintptr(unsafe.Pointer(unsafe.StringData(f.Name)))*31 ^ uintptr(unsafe.Pointer(unsafe.StringData(f.Value)))
	return (h >> 3) % uintptr(len(headerEncoder{}.recent))
}

// sameStrings: the same bytes at the same address (never a copy).
func sameStrings(a, b string) bool {
	return len(a) == len(b) && unsafe.StringData(a) == unsafe.StringData(b)
}

// appendVarInt appends i with an n-bit prefix (§5.1) to the first byte's
// flags.
func appendVarInt(dst []byte, n byte, flags byte, i uint64) []byte {
	k := uint64(1)<<n - 1
	if i < k {
		return append(dst, flags|byte(i))
	}
	dst = append(dst, flags|byte(k))
	i -= k
	for ; i >= 128; i >>= 7 {
		dst = append(dst, byte(0x80|(i&0x7f)))
	}
	return append(dst, byte(i))
}

// appendString appends s (§5.2), Huffman-coded when that is shorter.
func appendString(dst []byte, s string) []byte {
	if h := hpack.HuffmanEncodeLength(s); h < uint64(len(s)) {
		dst = appendVarInt(dst, 7, 0x80, h)
		return hpack.AppendHuffmanString(dst, s)
	}
	dst = appendVarInt(dst, 7, 0, uint64(len(s)))
	return append(dst, s...)
}
