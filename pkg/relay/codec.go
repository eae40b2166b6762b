package relay

import (
	"fmt"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// Frame is one gRPC message kept as its encoded bytes.
type Frame struct {
	Data []byte
}

// codec marshals *Frame as-is and anything else as protobuf. It is named
// "proto" so that the content-type on the wire stays application/grpc+proto
// and peers see no difference.
type codec struct{}

func (codec) Name() string { return "proto" }

func (codec) Marshal(v any) ([]byte, error) {
	switch m := v.(type) {
	case *Frame:
		return m.Data, nil
	case proto.Message:
		return proto.Marshal(m)
	default:
		return nil, fmt.Errorf("relay codec: cannot marshal %T", v)
	}
}

func (codec) Unmarshal(data []byte, v any) error {
	switch m := v.(type) {
	case *Frame:
		// grpc hands a codec a fresh slice it does not reuse, so keeping it is safe.
		m.Data = data
		return nil
	case proto.Message:
		return proto.Unmarshal(data, m)
	default:
		return fmt.Errorf("relay codec: cannot unmarshal into %T", v)
	}
}

// passFrame is a message relayed without being looked at: it keeps the
// buffers gRPC received it in and hands them back to gRPC for sending, so
// the bytes are neither copied nor allocated again. gRPC frees the buffers
// once they are written; free releases them when they never were.
type passFrame struct {
	buf mem.BufferSlice
}

func (f *passFrame) free() {
	if f.buf != nil {
		f.buf.Free()
		f.buf = nil
	}
}

// codecV2 is codec on gRPC's buffer API, which lets a *passFrame through
// without a copy. *Frame and protobuf messages are handled as codec does.
type codecV2 struct{}

func (codecV2) Name() string { return "proto" }

func (codecV2) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*passFrame); ok {
		// gRPC owns the buffers from here on and frees them after the write.
		buf := f.buf
		f.buf = nil
		return buf, nil
	}
	b, err := codec{}.Marshal(v)
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (codecV2) Unmarshal(data mem.BufferSlice, v any) error {
	if f, ok := v.(*passFrame); ok {
		// gRPC frees data when Unmarshal returns: keep a reference.
		data.Ref()
		f.free()
		f.buf = data
		return nil
	}
	return codec{}.Unmarshal(data.Materialize(), v)
}
