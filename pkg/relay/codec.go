package relay

import (
	"fmt"

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
