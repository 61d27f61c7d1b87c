package envoy

import (
	"fmt"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	// Every extension the shipped bootstraps name in an "@type" must be
	// registered, or protojson cannot resolve the Any.
	_ "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/filters/cel/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/buffer/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/priority/previous_priorities/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// ParseBootstrap decodes an Envoy bootstrap written in YAML (or JSON) into
// Envoy's own proto. Unknown fields and unregistered "@type"s are errors, as
// they are for Envoy. It does not validate; see Validate.
func ParseBootstrap(data []byte) (*bootstrapv3.Bootstrap, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("envoy: bootstrap is not YAML: %w", err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		return nil, fmt.Errorf("envoy: bootstrap does not match Envoy's proto: %w", err)
	}
	return &b, nil
}

// walkAny calls visit for every message packed in a google.protobuf.Any
// anywhere below m, unpacked, with a path naming where it sits; messages
// inside those are walked too.
func walkAny(m protoreflect.Message, path string, visit func(path string, msg proto.Message) error) error {
	var walkErr error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Kind() != protoreflect.MessageKind && fd.Kind() != protoreflect.GroupKind {
			return true
		}
		p := path + "." + string(fd.Name())
		switch {
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len() && walkErr == nil; i++ {
				walkErr = walkMessage(l.Get(i).Message(), fmt.Sprintf("%s[%d]", p, i), visit)
			}
		case fd.IsMap():
			if fd.MapValue().Kind() != protoreflect.MessageKind {
				return true
			}
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				walkErr = walkMessage(mv.Message(), fmt.Sprintf("%s[%q]", p, k.String()), visit)
				return walkErr == nil
			})
		default:
			walkErr = walkMessage(v.Message(), p, visit)
		}
		return walkErr == nil
	})
	return walkErr
}

func walkMessage(m protoreflect.Message, path string, visit func(string, proto.Message) error) error {
	if a, ok := m.Interface().(*anypb.Any); ok {
		inner, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("%s: unpack %s: %w", path, a.GetTypeUrl(), err)
		}
		if err := visit(path, inner); err != nil {
			return err
		}
		return walkAny(inner.ProtoReflect(), path, visit)
	}
	return walkAny(m, path, visit)
}
