(* One level of recursive rejection sampling (SpecInfer's multi-step speculative
   sampling; Sequoia), the rule of specsample.verify_tree.
   At a node of the draft tree with current residual law r (the target's law p
   there at first), the children are tried in order; child j carries a token
   drawn from its law q_j, independently of the others and of the verification
   uniforms: q_j = q for every j for siblings drawn i.i.d. from the draft (with
   replacement), q_j the one-hot at a fixed candidate for deterministic trees.
   Child j is accepted with probability acc r q_j (min(1, r(x)/q_j(x))); on a
   rejection the residual becomes resid r q_j r (norm(max(r - q_j, 0)), kept as r
   when that has no mass, as the implementation does); when no child is
   accepted, the emitted token is drawn from the last residual.
   Theorem rrs_level: the token emitted at the level has law r, for any number
   of children and any laws q_j.  The whole tree follows by induction on depth
   (proofs/tree_verification.md). *)

From mathcomp Require Import all_ssreflect all_algebra.
From SpecSample Require Import OneToken.

Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.

Import GRing.Theory Num.Theory Order.TTheory.
Local Open Scope ring_scope.

Section Tree.

Variable R : realFieldType.
Variable T : finType.

Definition distribution (f : T -> R) := (forall x, 0 <= f x) /\ \sum_x f x = 1.

(* Law of the token emitted at one level: the children's laws qs, in the order
   they are tried, against the residual r. *)
Fixpoint level (qs : seq (T -> R)) (r : T -> R) : T -> R :=
  match qs with
  | [::] => r
  | q :: rest => fun y => q y * acc r q y + rej r q * level rest (resid r q r) y
  end.

Theorem rrs_level qs r :
  (forall q, List.In q qs -> distribution q) -> distribution r ->
  forall y, level qs r y = r y.
Proof.
elim: qs r => [//|q rest IH] r hq [r0 r1] y /=.
have [q0 q1] := hq q (or_introl erefl).
rewrite IH.
- exact: one_token.
- by move=> q' h; apply: hq; right.
- split; [exact: resid_ge0 | exact: sum_resid].
Qed.

(* The two kinds of tree the implementation verifies. *)
Corollary rrs_iid q m r : distribution q -> distribution r ->
  forall y, level (nseq m q) r y = r y.
Proof.
move=> hq hr; apply: rrs_level => // q'; elim: m => [//|m IH] /= [<- //|]; exact: IH.
Qed.

Definition one_hot (x : T) : T -> R := fun y => (y == x)%:R.

Lemma one_hot_distribution x : distribution (one_hot x).
Proof.
split=> [y|]; first by rewrite /one_hot ler0n.
rewrite (bigD1 x) //= /one_hot eqxx big1 ?addr0 // => y /negbTE -> //.
Qed.

Corollary rrs_candidates (xs : seq T) r : distribution r ->
  forall y, level (map one_hot xs) r y = r y.
Proof.
move=> hr; apply: rrs_level => // q; elim: xs => [//|x xs IH] /= [<-|]; last exact: IH.
exact: one_hot_distribution.
Qed.

End Tree.
