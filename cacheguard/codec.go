package cacheguard

import "encoding/json"

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
