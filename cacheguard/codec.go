package cacheguard

import (
	"encoding/json"

	"github.com/vmihailenco/msgpack/v5"
)

// Codec encodes values inside the stored envelope. Implementations must be
// safe for concurrent use; Unmarshal must return an error, not panic, on bytes
// it cannot read (a panic is recovered and counted as a decode error anyway),
// and must not modify data (it is the reply's memory, not a copy).
type Codec interface {
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// JSON is the default Codec (encoding/json).
type JSON struct{}

// Marshal encodes v as JSON.
func (JSON) Marshal(v any) ([]byte, error) { return json.Marshal(v) }

// Unmarshal decodes JSON data into v.
func (JSON) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// MsgPack is a Codec that encodes values as MessagePack
// (github.com/vmihailenco/msgpack/v5, go-redis/cache's codec). It decodes a
// small record about three times as fast as JSON, with fewer allocations;
// fields are named by their `msgpack` tags, else by their Go names (not by
// `json` tags). Opt in with Encoding(MsgPack{}) on every Guard that shares
// the keys.
type MsgPack struct{}

// Marshal encodes v as MessagePack.
func (MsgPack) Marshal(v any) ([]byte, error) { return msgpack.Marshal(v) }

// Unmarshal decodes MessagePack data into v; it copies what it keeps.
func (MsgPack) Unmarshal(data []byte, v any) error { return msgpack.Unmarshal(data, v) }
