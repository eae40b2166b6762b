package relay

import (
	"strings"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"
	_ "k8s.io/cri-api/pkg/apis/runtime/v1" // registers the CRI descriptors
)

// idFields decodes a request only to log the container or sandbox ID it
// names. It runs at debug level only: pass-through frames are never decoded
// otherwise.
func idFields(method string, req []byte) []zap.Field {
	if len(req) == 0 {
		return nil
	}
	md := methodDesc(method)
	if md == nil {
		return nil
	}
	msg := dynamicpb.NewMessage(md.Input())
	if err := proto.Unmarshal(req, msg); err != nil {
		return nil
	}
	var out []zap.Field
	fields := md.Input().Fields()
	for _, name := range []struct{ field, key string }{
		{"container_id", "container_id"},
		{"pod_sandbox_id", "sandbox_id"},
	} {
		fd := fields.ByName(protoreflect.Name(name.field))
		if fd == nil || fd.Kind() != protoreflect.StringKind {
			continue
		}
		if v := msg.Get(fd).String(); v != "" {
			out = append(out, zap.String(name.key, v))
		}
	}
	return out
}

func methodDesc(method string) protoreflect.MethodDescriptor {
	// "/runtime.v1.RuntimeService/StartContainer"
	parts := strings.Split(strings.TrimPrefix(method, "/"), "/")
	if len(parts) != 2 {
		return nil
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(parts[0]))
	if err != nil {
		return nil
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil
	}
	return sd.Methods().ByName(protoreflect.Name(parts[1]))
}
