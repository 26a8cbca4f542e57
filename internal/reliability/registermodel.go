package reliability

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// RegisterOp is an operation on a fenced register.
type RegisterOp int

// Register operations.
const (
	Read RegisterOp = iota + 1
	Write
)

// RegisterInput is the input of a register operation.
type RegisterInput struct {
	Op     RegisterOp
	Client int
	Fence  uint64 // Write: the writer's fence token
	Value  string // Write: the value written
	// Valid says the write returned while its writer's lock was still valid by
	// the writer's own reckoning (Lock.TTL read before the write, on the local
	// monotonic clock).
	Valid bool
}

// RegisterOutput is the output of a register operation.
type RegisterOutput struct {
	Outcome Outcome // Done, Refused (writes), Unknown
	Fence   uint64  // Read: the token of the value read
	Value   string  // Read: the value read
}

type registerState struct {
	fence uint64
	value string
}

// RegisterModel is the sequential specification of a register guarded by
// fence tokens, as a resource protected by a lock should be, for porcupine:
//
//   - A write with a token lower than one already applied must be refused,
//     and a write with a token at least as high must be applied (the same
//     holder may write more than once with its token).
//   - A read returns the last value applied, with its token.
//   - A write made while its writer still held the lock (Valid) must not be
//     refused: it is refused only when a higher token was applied first, that
//     is when a later holder wrote while this one still held the lock — a
//     mutual-exclusion violation that fencing caught.
//   - An unknown write may or may not have been applied.
var RegisterModel = porcupine.NondeterministicModel{
	Init: func() []any { return []any{registerState{}} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(registerState), input.(RegisterInput), output.(RegisterOutput)
		switch in.Op {
		case Read:
			if out.Outcome == Unknown || (out.Fence == s.fence && out.Value == s.value) {
				return []any{s}
			}
			return nil
		case Write:
			applies := in.Fence >= s.fence
			next := registerState{fence: in.Fence, value: in.Value}
			switch out.Outcome {
			case Done:
				if applies {
					return []any{next}
				}
				return nil
			case Refused:
				if !applies && !in.Valid {
					return []any{s}
				}
				return nil
			default:
				if applies {
					return []any{s, next}
				}
				return []any{s}
			}
		}
		return nil
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(RegisterInput), output.(RegisterOutput)
		if in.Op == Read {
			if out.Outcome == Unknown {
				return fmt.Sprintf("read(c%d) → unknown", in.Client)
			}
			return fmt.Sprintf("read(c%d) → %d:%q", in.Client, out.Fence, out.Value)
		}
		v := ""
		if in.Valid {
			v = ", valid"
		}
		return fmt.Sprintf("write(c%d, %d:%q%s) → %v", in.Client, in.Fence, in.Value, v, out.Outcome)
	},
	DescribeState: func(state any) string {
		s := state.(registerState)
		return fmt.Sprintf("%d:%q", s.fence, s.value)
	},
}
