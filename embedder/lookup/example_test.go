package lookup_test

import (
	"errors"
	"fmt"

	"github.com/recmesh/recmesh/embedder/lookup"
)

func Example() {
	// Two tables: 3 rows with bags of 2 ids, 2 rows with bags of 1 id.
	// Row r of table t holds the value 10*t + r in every lane.
	vocab, hotness := []int{3, 2}, []int{2, 1}
	data := make([][]float32, len(vocab))
	for t, v := range vocab {
		data[t] = make([]float32, v*lookup.Dim)
		for i := range data[t] {
			data[t][i] = float32(10*t + i/lookup.Dim)
		}
	}
	tables, err := lookup.NewTables(data, hotness)
	if err != nil {
		panic(err)
	}
	// Two examples of Width() = 3 ids each: {bag 0: 0, 2; bag 1: 1}, ...
	ids := []int32{0, 2, 1, 1, 1, 0}
	out := make([]float32, tables.OutLen(2))
	if err := tables.Pool(out, ids, 2); err != nil {
		panic(err)
	}
	for e := range 2 {
		for t := range tables.NumTables() {
			fmt.Printf("example %d table %d: %v\n", e, t, out[(e*tables.NumTables()+t)*lookup.Dim])
		}
	}

	ids[4] = 3 // out of range for table 0
	err = tables.Pool(out, ids, 2)
	var ie *lookup.IDError
	fmt.Println(errors.As(err, &ie), ie.Example, ie.Table)
	// Output:
	// example 0 table 0: 2
	// example 0 table 1: 11
	// example 1 table 0: 2
	// example 1 table 1: 10
	// true 1 0
}
