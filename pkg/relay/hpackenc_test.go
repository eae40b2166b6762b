package relay

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"golang.org/x/net/http2/hpack"
)

// encoderScript drives headerEncoder and x/net's hpack.Encoder with the
// same blocks and decodes each with x/net's hpack.Decoder: every block must
// decode to the fields it was made from, table size updates included.
type encoderScript struct {
	t    testing.TB
	mine *headerEncoder
	ref  *hpack.Encoder
	refB bytes.Buffer
	dec  *hpack.Decoder
	// bytes written by each encoder
	mineN, refN int
}

func newEncoderScript(t testing.TB) *encoderScript {
	s := &encoderScript{t: t, mine: newHeaderEncoder(), dec: hpack.NewDecoder(defaultTableMax, nil)}
	s.ref = hpack.NewEncoder(&s.refB)
	return s
}

func (s *encoderScript) limit(v uint32) {
	s.mine.limit(v)
	s.ref.SetMaxDynamicTableSizeLimit(v)
}

func (s *encoderScript) block(fields []hpack.HeaderField) {
	s.t.Helper()
	s.mine.block()
	for _, f := range fields {
		s.mine.field(f)
	}
	got, err := s.dec.DecodeFull(s.mine.buf)
	if err != nil {
		s.t.Fatalf("decoding %x: %v (fields %v)", s.mine.buf, err, fields)
	}
	// A sensitive field goes as never-indexed, which decodes as Sensitive.
	want := slices.Clone(fields)
	if len(fields) == 0 {
		want = nil
	}
	if !reflect.DeepEqual(got, want) {
		s.t.Fatalf("block decoded to\n%v\nwant\n%v", got, want)
	}
	s.mineN += len(s.mine.buf)
	s.refB.Reset()
	for _, f := range fields {
		_ = s.ref.WriteField(f)
	}
	s.refN += s.refB.Len()
}

// TestHeaderEncoderRoundTrip: kubelet-like calls (indexed after the first),
// timeouts that change every call, huge and sensitive values, fields that
// are copies of earlier ones, and table size limits lowered on the way.
func TestHeaderEncoderRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := newEncoderScript(t)
	methods := []string{"/runtime.v1.RuntimeService/Version", "/runtime.v1.RuntimeService/ListContainers",
		"/runtime.v1.ImageService/ImageStatus", "/runtime.v1.RuntimeService/ContainerStatus"}
	for call := range 3000 {
		switch call {
		case 1000:
			s.limit(1000)
		case 1500:
			s.limit(0)
		case 1600:
			s.limit(200)
		}
		req := []hpack.HeaderField{
			{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
			{Name: ":path", Value: methods[rng.IntN(len(methods))]}, {Name: ":authority", Value: "localhost"},
			{Name: "content-type", Value: "application/grpc"}, {Name: "user-agent", Value: "grpc-go/1.80.0"},
			{Name: "te", Value: "trailers"},
			{Name: "grpc-timeout", Value: fmt.Sprintf("%du", rng.IntN(2000000))},
		}
		switch rng.IntN(10) {
		case 0:
			req = append(req, hpack.HeaderField{Name: "authorization", Value: "secret", Sensitive: true})
		case 1:
			req = append(req, hpack.HeaderField{Name: "x-big", Value: strings.Repeat("b", 5000)})
		case 2: // a copy: equal bytes at another address
			req = append(req, hpack.HeaderField{Name: strings.Clone("x-trace"), Value: strings.Clone("abc")})
		case 3:
			req = append(req, hpack.HeaderField{Name: "x-empty", Value: ""})
		case 4:
			req = append(req, hpack.HeaderField{Name: fmt.Sprintf("x-new-%d", call), Value: fmt.Sprint(call)})
		}
		s.block(req)
		s.block([]hpack.HeaderField{{Name: ":status", Value: "200"}, {Name: "content-type", Value: "application/grpc"}})
		s.block([]hpack.HeaderField{{Name: "grpc-status", Value: "0"}, {Name: "grpc-message", Value: ""}})
		if rng.IntN(50) == 0 {
			s.block(nil)
		}
	}
	// As compact as x/net's encoder: the same representations.
	if float64(s.mineN) > 1.01*float64(s.refN) {
		t.Errorf("encoded %d bytes, x/net's encoder %d", s.mineN, s.refN)
	}
	t.Logf("encoded %d bytes, x/net's encoder %d", s.mineN, s.refN)
}

// FuzzHeaderEncoder: any sequence of fields and limits decodes back.
func FuzzHeaderEncoder(f *testing.F) {
	f.Add([]byte("\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\xfe\x01\x02\x03"))
	f.Add(bytes.Repeat([]byte{0x11, 0x22, 0x33, 0xff}, 40))
	f.Fuzz(func(t *testing.T, data []byte) {
		s := newEncoderScript(t)
		// A vocabulary of strings, each one object, so that repeats are
		// the same string (the encoder's cache) or a copy of it.
		vocab := []string{":path", "/a", ":status", "200", "content-type", "application/grpc", "x", "", "grpc-status", "0",
			strings.Repeat("v", 300), strings.Repeat("w", 4100), "te", "trailers", ":method", "POST"}
		var fields []hpack.HeaderField
		for i := 0; i+1 < len(data); i += 2 {
			a, b := data[i], data[i+1]
			switch {
			case a == 0xff:
				s.block(fields)
				fields = fields[:0]
			case a == 0xfe:
				s.limit(uint32(b) * 20)
			default:
				name, value := vocab[int(a)%len(vocab)], vocab[int(b)%len(vocab)]
				if a&0x80 != 0 {
					name = strings.Clone(name)
				}
				if name == "" {
					name = "e"
				}
				fields = append(fields, hpack.HeaderField{Name: name, Value: value, Sensitive: b&0x40 != 0 && b&0x20 != 0})
			}
		}
		s.block(fields)
	})
}
