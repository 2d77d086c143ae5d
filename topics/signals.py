"""Keep the in-memory topic tree (topics.tree) in step with the database."""

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from . import tree
from .models import Topic, TopicKeyword


@receiver(post_save, sender=Topic, dispatch_uid="topics.tree.topic_saved")
@receiver(post_delete, sender=Topic, dispatch_uid="topics.tree.topic_deleted")
@receiver(post_save, sender=TopicKeyword, dispatch_uid="topics.tree.keyword_saved")
@receiver(post_delete, sender=TopicKeyword, dispatch_uid="topics.tree.keyword_deleted")
def topic_changed(sender, **kwargs) -> None:
    tree.changed()
