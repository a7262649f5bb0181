package lookup

// poolGeneric is the plain-Go kernel: the reference every other kernel is
// tested against, and the kernel of builds without assembly. Each pooled
// row starts as a copy of the bag's first row and adds the others in bag
// order; the assembly kernels keep that order so results are bit-identical.
// Tables at other precisions than fp32 go to poolDequant.
func poolGeneric(t *Tables, out []float32, ids []int32, n int) {
	if t.rows == nil {
		poolDequant(t, out, ids, n)
		return
	}
	k, o := 0, 0
	for range n {
		for i, h := range t.hot {
			tab := t.rows[i]
			dst := out[o : o+Dim : o+Dim]
			id := int(ids[k])
			copy(dst, tab[id*Dim:id*Dim+Dim])
			for _, id := range ids[k+1 : k+h] {
				src := tab[int(id)*Dim : int(id)*Dim+Dim : int(id)*Dim+Dim]
				for d := range dst {
					dst[d] += src[d]
				}
			}
			k += h
			o += Dim
		}
	}
}
