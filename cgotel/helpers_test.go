package cgotel_test

import "go.opentelemetry.io/otel/attribute"

type attributeKV = attribute.KeyValue

// attr returns the value of attribute key, or "".
func attr(kvs []attribute.KeyValue, key string) string {
	for _, kv := range kvs {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}
