(* Sums over all sequences of a given length of a finite type:
     sumlen m f = sum over t in T^m of f t,
   defined by recursion on m (first letter outermost). *)

From mathcomp Require Import all_ssreflect all_algebra.

Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.

Import GRing.Theory.
Local Open Scope ring_scope.

Section SeqSum.

Variable R : ringType.
Variable T : finType.

Fixpoint sumlen (m : nat) (f : seq T -> R) : R :=
  if m is m'.+1 then \sum_x sumlen m' (fun t => f (x :: t)) else f [::].

Lemma eq_sumlen m f g : f =1 g -> sumlen m f = sumlen m g.
Proof.
elim: m f g => [|m IH] f g fg /=; first exact: fg.
by apply: eq_bigr => x _; apply: IH => t.
Qed.

Lemma sumlenD m f g :
  sumlen m (fun t => f t + g t) = sumlen m f + sumlen m g.
Proof.
elim: m f g => [|m IH] f g //=; rewrite -big_split /=.
by apply: eq_bigr => x _; rewrite IH.
Qed.

Lemma sumlenZ m a f : sumlen m (fun t => a * f t) = a * sumlen m f.
Proof.
elim: m f => [|m IH] f //=; rewrite mulr_sumr.
by apply: eq_bigr => x _; rewrite IH.
Qed.

Lemma sumlen0 m : sumlen m (fun _ => 0) = 0.
Proof.
by elim: m => [|m IH] //=; apply: big1 => x _; exact: IH.
Qed.

(* Only the empty sequence has length 0. *)
Lemma sumlen_nil m b :
  sumlen m (fun t => if t is [::] then b else 0) = if m is 0 then b else 0.
Proof.
case: m => [|m] //=; apply: big1 => x _.
exact: sumlen0.
Qed.

End SeqSum.
